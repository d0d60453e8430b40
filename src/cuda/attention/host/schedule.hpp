// What plan_attention decides for a step (msa/cuda_schedule.hpp), as a pure
// host function of the step, the problem, the tuning and a few facts of the
// device (plan.cpp gathers them), so that the CPU tests check it directly.
// Every decision of the CUDA attention is made here; attend() runs the result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/widen/choice.hpp"
#include "msa/batch.hpp"
#include "msa/cuda_schedule.hpp"
#include "msa/error.hpp"

namespace msa::cuda::attention {

// What the schedule needs to know of the device.
struct DeviceFacts {
  int num_sms = 132;
  // Clusters the split rule counts on (plan.cpp: cluster_capacity).
  ClusterCapacity split_capacity;
  // Clusters of the row-kernel instance that runs (the cache's kind, row_f16).
  ClusterCapacity row_capacity;
  // The driver encodes TMA tensor maps (the wgmma tiles load through them).
  bool tensor_maps = true;
  // build_k2q's scratch bytes (msa::cuda::k2q_workspace_bytes).
  std::size_t (*k2q_bytes)(std::int32_t num_tokens, std::int32_t num_requests, int num_kv_heads, int topk,
                           std::int64_t num_rows) = nullptr;
};

// Throws msa::Error naming the first unsupported field of the problem.
inline void check_problem(const AttentionProblem& s) {
  MSA_CHECK(s.num_kv_heads >= 1, "attention: cache.num_kv_heads = ", s.num_kv_heads, " but must be at least 1");
  MSA_CHECK(s.num_q_heads >= 1 && s.num_q_heads % s.num_kv_heads == 0, "attention: num_q_heads = ", s.num_q_heads,
            " is not a positive multiple of cache.num_kv_heads = ", s.num_kv_heads);
  const int group = s.num_q_heads / s.num_kv_heads;
  MSA_CHECK(group <= kMaxGroup, "attention: GQA group num_q_heads / num_kv_heads = ", group, " but at most ",
            kMaxGroup, " is supported");
  MSA_CHECK(s.topk >= 1 && s.topk <= kMaxTopk, "attention: topk.topk = ", s.topk, " is not in [1, ", kMaxTopk, "]");
  MSA_CHECK(is_half(s.q_dtype) || s.q_dtype == DType::fp8_e4m3, "attention: q_dtype = ", dtype_name(s.q_dtype),
            " but queries are bf16, fp16 or fp8_e4m3");
  MSA_CHECK(is_half(s.out_dtype), "attention: out_dtype = ", dtype_name(s.out_dtype),
            " but outputs are bf16 or fp16");
  MSA_CHECK(!is_half(s.q_dtype) || s.out_dtype == s.q_dtype, "attention: out_dtype = ", dtype_name(s.out_dtype),
            " but a ", dtype_name(s.q_dtype), " query gives an output of the same dtype");
  MSA_CHECK(is_half(s.kv_dtype) || is_fp8(s.kv_dtype) || s.kv_dtype == DType::nvfp4,
            "attention: cache.dtype = ", dtype_name(s.kv_dtype),
            " but the KV cache is bf16, fp16, fp8_e4m3, fp8_e5m2 or nvfp4");
  MSA_CHECK(!s.kv_token_scales || is_fp8(s.kv_dtype), "attention: kv_token_scales is set but cache.dtype = ",
            dtype_name(s.kv_dtype), " has no per-(token, head) scales (fp8 caches only)");
}

// Throws msa::Error naming the first knob out of range.
inline void check_tuning(const AttentionTuning& t) {
  const auto order = static_cast<std::int32_t>(t.prefill_order);
  MSA_CHECK(order >= 0 && order <= 2, "attention tuning: prefill_order = ", order,
            " is not query_major (0), key_major (1) or automatic (2)");
  MSA_CHECK(t.decode_splits >= 0 && t.decode_splits <= kMaxSplits, "attention tuning: decode_splits = ",
            t.decode_splits, " is not in [0, ", kMaxSplits, "] (0: the plan chooses)");
  MSA_CHECK(t.prefill_splits >= 0 && t.prefill_splits <= kMaxSplits, "attention tuning: prefill_splits = ",
            t.prefill_splits, " is not in [0, ", kMaxSplits, "] (0: the plan chooses)");
  MSA_CHECK(t.tile_splits >= 0 && t.tile_splits <= kMaxTileSplits, "attention tuning: tile_splits = ", t.tile_splits,
            " is not in [0, ", kMaxTileSplits, "] (0: the plan chooses)");
  MSA_CHECK(t.tile_split_sms >= 0, "attention tuning: tile_split_sms = ", t.tile_split_sms, " is negative");
  MSA_CHECK(t.widen_bytes >= -1, "attention tuning: widen_bytes = ", t.widen_bytes,
            " but must be -1 (the default limit), 0 (never widen ahead) or a byte limit");
  MSA_CHECK(t.key_major_min_tokens >= 0, "attention tuning: key_major_min_tokens = ", t.key_major_min_tokens,
            " is negative");
  const auto kernel = static_cast<std::int32_t>(t.tile_kernel);
  MSA_CHECK(kernel == 0 || kernel == 1, "attention tuning: tile_kernel = ", kernel,
            " is not automatic (0) or mma_sync (1)");
}

// The workspace's one allocator: each piece starts at the next multiple of
// its alignment after the previous one.
struct BumpAllocator {
  std::size_t at = 0;
  std::size_t take(std::size_t bytes, std::size_t align = kWorkspaceAlign) {
    const std::size_t offset = align_up(at, align);
    at = offset + bytes;
    return offset;
  }
};

// Lays out the schedule's workspace (AttentionWorkspaceMap, in its order).
//   k2q_bytes: build_k2q's scratch for a key-major step
inline AttentionWorkspaceMap map_workspace(const AttentionSchedule& s, std::size_t k2q_bytes) {
  AttentionWorkspaceMap m;
  BumpAllocator a;
  const auto T = std::size_t(s.num_tokens), QH = std::size_t(s.problem.num_q_heads);
  const auto H = std::size_t(s.problem.num_kv_heads), K = std::size_t(s.problem.topk);
  // Split rows: the tokens of the classes that split, from token 0.
  m.max_splits = std::max(s.decode_splits, s.prefill_splits);
  if (m.max_splits > 1) {
    m.partial_tokens = s.prefill_splits > 1 ? s.num_tokens : s.num_decode_tokens;
    const std::size_t entries = std::size_t(m.partial_tokens) * QH * std::size_t(m.max_splits);
    m.partial_out = a.take(entries * 128 * sizeof(float));
    m.partial_lse = a.take(entries * sizeof(float));
    m.counter_bytes = std::size_t(m.partial_tokens) * H * sizeof(std::int32_t);
    m.counters = a.take(m.counter_bytes);
  }
  m.tile_partial_out = m.tile_partial_lse = a.take(0);
  if (s.tile_splits > 1) {
    const std::size_t rows = T * QH * std::size_t(s.tile_splits);
    m.tile_partial_out = a.take(rows * kDim16Bytes);
    m.tile_partial_lse = a.take(rows * sizeof(float));
  }
  if (s.prefill == PrefillKernel::key_major) {
    const std::int64_t rows = s.key_major_rows * s.problem.num_kv_heads;
    m.k2q_edges = std::int64_t(T * H * K);
    m.km_max_items = key_major_max_items(m.k2q_edges, rows,
                                         key_major_item_tokens(s.problem.num_q_heads / s.problem.num_kv_heads));
    const std::size_t partials = T * QH * K;
    m.k2q_offsets = a.take(sizeof(std::int64_t) * std::size_t(rows + 1));
    m.k2q_tokens = a.take(sizeof(std::int32_t) * std::size_t(m.k2q_edges));
    m.k2q_slots = a.take(sizeof(std::int32_t) * std::size_t(m.k2q_edges));
    m.k2q_counts = a.take(sizeof(std::int32_t) * T * H);
    m.k2q_scratch_bytes = k2q_bytes;
    m.k2q_scratch = a.take(k2q_bytes);
    m.km_items = a.take(kKeyMajorItemBytes * std::size_t(m.km_max_items));
    m.km_stats = a.take(kKeyMajorStats * sizeof(std::int64_t));
    m.km_partial_out = a.take(partials * kDim16Bytes);
    m.km_partial_lse = a.take(partials * sizeof(float));
  }
  if (s.widen_pages > 0) {
    const auto cap = std::size_t(s.widen_block_cap), pages = std::size_t(s.widen_pages);
    const auto first = std::size_t(s.widen_first_request), requests = std::size_t(s.widen_requests);
    m.widen_table = a.take((first + requests) * cap * 4);
    m.widen_fill = m.widen_table + first * cap * 4;
    m.widen_counters = a.take(16, 4);
    m.widen_claims = a.take(requests * H * cap * 4, 4);
    m.widen_fill_bytes = a.at - m.widen_fill;
    m.widen_items = a.take(pages * H * 16);
    m.widen_gates = a.take(16);
    const std::size_t plane = pages * H * std::size_t(kWidenHeadBytes / 2);
    m.widen_k = a.take(plane, 1024);
    m.widen_v = a.take(plane, 1);
    m.widen_scales = a.take(s.widen_scales ? pages * H * std::size_t(kWidenScaleBytes) : 0, 1);
  }
  m.bytes = align_up(a.at, kWorkspaceAlign);
  return m;
}

// The schedule of a step (the problem and the tuning already checked).
inline AttentionSchedule make_schedule(const BatchMetadata& meta, const AttentionProblem& problem,
                                       const AttentionTuning& tuning, const DeviceFacts& device) {
  MSA_CHECK(meta.num_tokens >= 0 && meta.num_decode_tokens >= 0 && meta.num_decode_tokens <= meta.num_tokens,
            "attention plan: num_decode_tokens = ", meta.num_decode_tokens, " is not in [0, num_tokens = ",
            meta.num_tokens, "]");
  AttentionSchedule s;
  s.problem = problem;
  s.tuning = tuning;
  s.num_tokens = meta.num_tokens;
  s.num_decode_tokens = meta.num_decode_tokens;
  const int H = problem.num_kv_heads, G = problem.num_q_heads / problem.num_kv_heads, K = problem.topk;
  const DType kv = problem.kv_dtype;
  const bool out_f16 = problem.out_dtype == DType::fp16;
  const std::int64_t prefill_tokens = std::int64_t(meta.num_tokens) - meta.num_decode_tokens;

  // Split-K factors (heuristics.hpp), then the tuning's.
  const bool converted = row_converts_slowly(kv, out_f16, problem.kv_token_scales);
  const Splits splits = choose_step_splits(meta.num_tokens, meta.num_decode_tokens, H, K, device.num_sms,
                                           device.split_capacity, converted, row_kernel_ctas_per_sm(kv));
  s.decode_splits = tuning.decode_splits > 0 && meta.num_decode_tokens > 0 ? tuning.decode_splits : splits.decode;
  s.prefill_splits = tuning.prefill_splits > 0 && prefill_tokens > 0 ? tuning.prefill_splits : splits.prefill;
  s.row_f16 = row_f16(kv, out_f16, problem.kv_token_scales);

  // Decode rows: the row kernel; a split class merges in clusters when all of them fit at once.
  auto cluster = [&](int row_splits, std::int64_t ctas) {
    return use_cluster_merge(row_splits) && ctas / row_splits <= device.row_capacity.clusters[row_splits] ? row_splits
                                                                                                           : 0;
  };
  s.decode_ctas = std::int64_t(meta.num_decode_tokens) * H * s.decode_splits;
  s.decode_cluster = cluster(s.decode_splits, s.decode_ctas);

  // Prefill rows: the kernel family.
  const bool tiles = prefill_tokens > 0 && use_token_tiles(G, K, s.prefill_splits);
  if (prefill_tokens <= 0) {
    s.prefill = PrefillKernel::none;
  } else if (!tiles) {
    s.prefill = PrefillKernel::rows;
    s.prefill_ctas = prefill_tokens * H * s.prefill_splits;
    s.prefill_cluster = cluster(s.prefill_splits, s.prefill_ctas);
  } else {
    s.num_requests = meta.num_requests;  // (the tile numbers depend on it)
    s.tile_tokens = tile_tokens(G, K);
    s.tiles = tile_ctas(prefill_tokens, meta.num_requests, s.tile_tokens, H);
    // The wgmma tiles load K / V (but nvfp4's head-slot runs) and a bf16 /
    // fp16 query's first tile through TMA maps.
    const bool maps = (kv == DType::nvfp4 || device.tensor_maps) && (!is_half(problem.q_dtype) || device.tensor_maps);
    const bool wgmma = tuning.tile_kernel == TileKernel::automatic && use_wgmma_tiles(true, G, s.tile_tokens) && maps;
    // fp8 / nvfp4: the step's blocks widened ahead (widen/choice.hpp), read through TMA maps.
    WidenChoice w;
    if (wgmma && !is_half(kv) && device.tensor_maps) {
      std::vector<std::int32_t> query_lens, blocks;
      for (std::int32_t r = meta.num_decodes; r < meta.num_requests; ++r) {
        query_lens.push_back(meta.query_start[std::size_t(r) + 1] - meta.query_start[std::size_t(r)]);
        blocks.push_back(meta.num_blocks(r));
      }
      w = choose_widen(kv, problem.kv_token_scales, true, tuning.widen_bytes, H, K, meta.num_decodes, query_lens,
                       blocks);
    }
    // Key-major reads bf16 / fp16 pages: the cache's own, or every selected
    // block widened ahead (not gated) without per-token scales.
    const bool km_pages = is_half(kv) || (w.pages > 0 && !w.gated && !w.scales);
    const KeyMajorMode km = wgmma ? key_major_mode(static_cast<int>(tuning.prefill_order), km_pages, true,
                                                   meta.num_tokens, meta.num_decode_tokens, meta.num_requests,
                                                   tuning.key_major_min_tokens)
                                  : KeyMajorMode::off;
    auto take_widen = [&] {
      s.widen_pages = w.pages;
      s.widen_gated = w.gated;
      s.widen_first_request = w.first_request;
      s.widen_requests = w.requests;
      s.widen_block_cap = w.block_cap;
      s.widen_scales = w.scales;
    };
    if (!wgmma) {
      s.prefill = PrefillKernel::mma_sync_tiles;
    } else if (km != KeyMajorMode::off) {
      s.prefill = PrefillKernel::key_major;
      s.key_major_always = km == KeyMajorMode::always;
      for (std::int32_t r = 0; r < meta.num_requests && r < std::int32_t(meta.seq_lens.size()); ++r)
        s.key_major_rows += meta.num_blocks(r);
      if (w.pages > 0) take_widen();
    } else if (w.pages > 0) {
      s.prefill = PrefillKernel::widened_tiles;
      take_widen();
    } else {
      s.prefill = PrefillKernel::wgmma_tiles;
    }
    // Split tiles: only on the persistent wgmma kernel (bf16 / fp16 caches, or
    // blocks widened ahead that surely fit).
    const bool persistent = (s.prefill == PrefillKernel::wgmma_tiles && is_half(kv)) ||
                            (s.prefill == PrefillKernel::widened_tiles && !s.widen_gated);
    if (persistent) {
      const TileSplit t =
          tuning.tile_splits > 0
              ? TileSplit{tuning.tile_splits, 0}
              : choose_tile_split(s.tiles, tuning.tile_split_sms > 0 ? tuning.tile_split_sms : device.num_sms, H);
      s.tile_splits = t.splits;
      s.tile_split_from = t.splits > 1 ? t.from : 0;
    }
  }
  const std::int64_t kGrid = std::numeric_limits<std::int32_t>::max();
  MSA_CHECK(s.decode_ctas + s.prefill_ctas <= kGrid && s.tiles <= kGrid, "attention plan: ",
            std::max(s.decode_ctas + s.prefill_ctas, s.tiles),
            " CTAs exceed the grid limit (tokens x kv heads x splits)");

  std::size_t k2q = 0;
  if (s.prefill == PrefillKernel::key_major && device.k2q_bytes != nullptr)
    k2q = device.k2q_bytes(meta.num_tokens, meta.num_requests, H, K, s.key_major_rows);
  s.map = map_workspace(s, k2q);
  return s;
}

}  // namespace msa::cuda::attention
