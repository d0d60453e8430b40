// Run step of the CUDA sparse attention: host-side shape checks, the kernel
// parameters, and the dispatch to the kernel instances: the row kernel (which
// also merges split rows) for decode rows and for prefill rows that split, the
// token-tile kernel for the other prefill rows (heuristics.hpp; fp8 / nvfp4
// caches widen the step's blocks ahead, widen.hpp), and, in a
// step that may run key-major, the k2q plan, the key-major kernel and the
// merge of its partials (key_major.hpp). Each split class merges in a
// thread-block cluster or through the workspace; allocates nothing and never
// synchronizes the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/checks.hpp"
#include "cuda/attention/heuristics.hpp"
#include "cuda/attention/key_major.hpp"
#include "cuda/attention/kv_maps.hpp"
#include "cuda/attention/launch.hpp"
#include "cuda/attention/launch_wgmma.hpp"
#include "cuda/attention/params.cuh"
#include "cuda/attention/plan_internal.hpp"
#include "cuda/attention/widen.hpp"
#include "cuda/common/check.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace attention {
namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

void check_cache(const KVCacheView& c) {
  MSA_CHECK(c.num_pages >= 0, "attend: cache.num_pages = ", c.num_pages, " is negative");
  if (c.num_pages == 0) return;  // nothing can be read: every page id is out of range
  MSA_CHECK(c.k != nullptr && (c.v != nullptr || c.dtype == DType::nvfp4),
            "attend: cache.k / cache.v is null");
  if (c.dtype == DType::nvfp4) {
    MSA_CHECK(aligned16(c.k), "attend: the nvfp4 cache base must be 16-byte aligned");
    MSA_CHECK(c.page_stride % 16 == 0 && c.page_stride >= 2 * c.num_kv_heads * nvfp4::kSlotBytes,
              "attend: nvfp4 cache.page_stride = ", c.page_stride,
              " bytes must be a multiple of 16 and at least ", 2 * c.num_kv_heads * nvfp4::kSlotBytes);
    return;
  }
  const auto eb = std::int64_t(dtype_bytes(c.dtype));
  MSA_CHECK(aligned16(c.k) && aligned16(c.v), "attend: cache.k and cache.v must be 16-byte aligned");
  MSA_CHECK((c.page_stride * eb) % 16 == 0, "attend: cache.page_stride = ", c.page_stride,
            " elements is not a multiple of 16 bytes");
  MSA_CHECK((c.head_stride * eb) % 16 == 0, "attend: cache.head_stride = ", c.head_stride,
            " elements is not a multiple of 16 bytes");
  MSA_CHECK((c.token_stride * eb) % 16 == 0, "attend: cache.token_stride = ", c.token_stride,
            " elements is not a multiple of 16 bytes");
  if (is_fp8(c.dtype) && c.scale_mode == ScaleMode::per_token_head)
    MSA_CHECK(c.k_scales != nullptr && c.v_scales != nullptr,
              "attend: per_token_head fp8 scales but cache.k_scales / cache.v_scales is null");
}

void check_run(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args) {
  const AttentionShape& s = plan.shape;
  MSA_CHECK(plan.num_tokens == step.num_tokens, "attend: the plan is for ", plan.num_tokens,
            " tokens but the step has ", step.num_tokens);
  MSA_CHECK(plan.num_decode_tokens == step.num_decode_tokens, "attend: the plan is for ",
            plan.num_decode_tokens, " decode tokens but the step has ", step.num_decode_tokens);
  MSA_CHECK(args.num_q_heads == s.num_q_heads, "attend: args.num_q_heads = ", args.num_q_heads,
            " but the plan has ", s.num_q_heads);
  MSA_CHECK(args.cache.num_kv_heads == s.num_kv_heads, "attend: cache.num_kv_heads = ",
            args.cache.num_kv_heads, " but the plan has ", s.num_kv_heads);
  MSA_CHECK(args.topk.topk == s.topk, "attend: topk.topk = ", args.topk.topk, " but the plan has ",
            s.topk);
  MSA_CHECK(args.q_dtype == s.q_dtype, "attend: q_dtype = ", dtype_name(args.q_dtype),
            " but the plan has ", dtype_name(s.q_dtype));
  MSA_CHECK(args.out_dtype == s.out_dtype, "attend: out_dtype = ", dtype_name(args.out_dtype),
            " but the plan has ", dtype_name(s.out_dtype));
  MSA_CHECK(args.cache.dtype == s.kv_dtype, "attend: cache dtype = ", dtype_name(args.cache.dtype),
            " but the plan has ", dtype_name(s.kv_dtype));
  MSA_CHECK(plan.decode_splits >= 1 && plan.decode_splits <= kMaxSplits && plan.prefill_splits >= 1 &&
                plan.prefill_splits <= kMaxSplits,
            "attend: plan splits (", plan.decode_splits, ", ", plan.prefill_splits,
            ") are not in [1, ", kMaxSplits, "]");
  const WorkspaceLayout layout =
      workspace_layout(plan.num_tokens, plan.num_decode_tokens, s.num_q_heads, s.num_kv_heads,
                       Splits{plan.decode_splits, plan.prefill_splits});
  MSA_CHECK(layout.bytes == 0 || (plan.workspace != nullptr && plan.workspace_bytes >= layout.bytes &&
                                  plan.partial_out != nullptr && plan.partial_lse != nullptr),
            "attend: the plan splits rows (", plan.decode_splits, " / ", plan.prefill_splits,
            ") but its workspace has ", plan.workspace_bytes, " bytes of the ", layout.bytes, " needed");
  if (step.num_tokens == 0) return;
  MSA_CHECK(args.q != nullptr && args.out != nullptr, "attend: args.q / args.out is null");
  MSA_CHECK(aligned16(args.q) && aligned16(args.out), "attend: args.q and args.out must be 16-byte aligned");
  MSA_CHECK(args.topk.data != nullptr, "attend: args.topk.data is null");
  MSA_CHECK(args.block_table.data != nullptr || step.num_requests == 0,
            "attend: args.block_table.data is null");
  MSA_CHECK(std::isfinite(args.softmax_scale), "attend: softmax_scale = ", args.softmax_scale,
            " is not finite");
  MSA_CHECK(args.q_dtype != DType::fp8_e4m3 || std::isfinite(args.q_scale), "attend: q_scale = ",
            args.q_scale, " is not finite");
  check_cache(args.cache);
}

AttendParams make_params(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args,
                         const DeviceCheck& check) {
  const KVCacheView& c = args.cache;
  AttendParams p;
  p.q = args.q;
  p.q_kind = args.q_dtype == DType::fp16 ? kQueryFp16 : args.q_dtype == DType::fp8_e4m3 ? kQueryE4m3 : kQueryBf16;
  p.out = args.out;
  p.out_fp16 = args.out_dtype == DType::fp16;
  p.lse = args.lse;
  p.partial_out = plan.partial_out;
  p.partial_lse = plan.partial_lse;
  const WorkspaceLayout layout =
      workspace_layout(plan.num_tokens, plan.num_decode_tokens, plan.shape.num_q_heads,
                       plan.shape.num_kv_heads, Splits{plan.decode_splits, plan.prefill_splits});
  if (layout.bytes > 0)
    p.counters = reinterpret_cast<int*>(static_cast<unsigned char*>(plan.workspace) + layout.counter_offset);
  p.max_splits = std::max(plan.decode_splits, plan.prefill_splits);
  p.num_q_heads = plan.shape.num_q_heads;
  p.num_kv_heads = plan.shape.num_kv_heads;
  p.group = p.num_q_heads / p.num_kv_heads;

  float k_scale = 1.0f, v_scale = 1.0f;
  const bool token_scales = is_fp8(c.dtype) && c.scale_mode == ScaleMode::per_token_head;
  if ((is_fp8(c.dtype) && !token_scales) || c.dtype == DType::nvfp4) {
    k_scale = c.k_scale;
    v_scale = c.v_scale;
  }
  const float q_scale = args.q_dtype == DType::fp8_e4m3 ? args.q_scale : 1.0f;
  p.score_scale_log2 = args.softmax_scale * 1.4426950408889634f * k_scale * q_scale;
  p.out_scale = v_scale;

  p.num_tokens = step.num_tokens;
  p.num_decode_tokens = step.num_decode_tokens;
  p.num_requests = step.num_requests;
  p.query_start = step.query_start;
  p.seq_lens = step.seq_lens;
  p.token_request = step.token_request;

  p.topk = args.topk.data;
  p.topk_token_stride = args.topk.token_stride;
  p.topk_head_stride = args.topk.head_stride;
  p.topk_count = args.topk.topk;

  p.k_base = static_cast<const unsigned char*>(c.k);
  p.v_base = static_cast<const unsigned char*>(c.v);
  p.page_stride = c.page_stride;
  p.head_stride = c.head_stride;
  p.token_stride = c.token_stride;
  p.num_pages = c.num_pages;
  p.k_scales = token_scales ? c.k_scales : nullptr;
  p.v_scales = token_scales ? c.v_scales : nullptr;

  p.table = args.block_table.data;
  p.table_stride = args.block_table.row_stride;
  p.table_rows = args.block_table.num_rows;
  p.table_cols = args.block_table.max_blocks;

  p.decode_splits = plan.decode_splits;
  p.prefill_splits = plan.prefill_splits;
  p.check = check.buffer;
  return p;
}

using F16 = std::true_type;
using Bf16 = std::false_type;
using Half = std::integral_constant<KvKind, KvKind::half>;
using E4m3 = std::integral_constant<KvKind, KvKind::e4m3>;
using E5m2 = std::integral_constant<KvKind, KvKind::e5m2>;
using Nvfp4 = std::integral_constant<KvKind, KvKind::nvfp4>;

// Calls fn(kind, fp16) with the instance of the cache dtype (the MMA type: the
// cache's for bf16 / fp16 caches, else fp16 when f16).
template <class Fn>
void dispatch(DType kv, bool f16, const char* what, Fn&& fn) {
  switch (kv) {
    case DType::bf16: return fn(Half{}, Bf16{});
    case DType::fp16: return fn(Half{}, F16{});
    case DType::fp8_e4m3: return f16 ? fn(E4m3{}, F16{}) : fn(E4m3{}, Bf16{});
    case DType::fp8_e5m2: return f16 ? fn(E5m2{}, F16{}) : fn(E5m2{}, Bf16{});
    case DType::nvfp4: return f16 ? fn(Nvfp4{}, F16{}) : fn(Nvfp4{}, Bf16{});
    default: fail(what, ": cache dtype ", dtype_name(kv), " is not a KV cache dtype");
  }
}

// The row kernel (kTiles false) or the token-tile kernel.
template <bool kTiles>
void launch(const AttendParams& p, DType kv, bool f16, std::int64_t ctas, cudaStream_t s) {
  dispatch(kv, f16, "attend", [&](auto kind, auto fp16) {
    constexpr KvKind kKind = decltype(kind)::value;
    constexpr bool kF16 = decltype(fp16)::value;
    if constexpr (kTiles) launch_attend_tiles<kKind, kF16>(p, ctas, s);
    else launch_attend<kKind, kF16>(p, ctas, s);
  });
}

}  // namespace

void prepare_kernels(const AttentionShape& shape) {
  // The row kernel on fp16 MMA (row_f16; the shape does not say whether fp8
  // scales are per token), and every kernel on the output's type.
  dispatch(shape.kv_dtype, true, "attention", [](auto kind, auto fp16) {
    prepare_attend<decltype(kind)::value, decltype(fp16)::value>();
  });
  dispatch(shape.kv_dtype, shape.out_dtype == DType::fp16, "attention", [&](auto kind, auto fp16) {
    constexpr KvKind kKind = decltype(kind)::value;
    constexpr bool kF16 = decltype(fp16)::value;
    prepare_attend<kKind, kF16>();
    prepare_attend_tiles<kKind, kF16>();
    prepare_attend_wgmma_tiles<kKind, kF16>();
    if constexpr (kKind == KvKind::half) {
      prepare_attend_key_major<kF16>();
    } else {
      prepare_attend_wgmma_tiles<KvKind::half, kF16>();  // tiles over blocks widened ahead (widen.hpp)
      if (kKind != KvKind::nvfp4 && shape.kv_token_scales) prepare_attend_wgmma_tiles<KvKind::half, kF16, true>();
    }
  });
}

ClusterCapacity cluster_capacity(const AttentionShape& shape, bool one_cta_per_sm) {
  // Either row-kernel instance may run (row_f16): the smaller capacity. At
  // one CTA per SM, the bf16 row kernel's (its shared memory holds one CTA
  // per SM) stands for a kernel that fits more.
  const DType kv = one_cta_per_sm && row_kernel_ctas_per_sm(shape.kv_dtype) > 1 ? DType::bf16 : shape.kv_dtype;
  ClusterCapacity c;
  for (const bool f16 : {true, shape.out_dtype == DType::fp16}) {
    dispatch(kv, f16, "attention", [&](auto kind, auto fp16) {
      constexpr KvKind kKind = decltype(kind)::value;
      constexpr bool kF16 = decltype(fp16)::value;
      for (int size = 2; size <= kMaxClusterSplits; ++size) {
        const int n = row_cluster_capacity<kKind, kF16>(size);
        c.clusters[size] = f16 ? n : std::min(c.clusters[size], n);
      }
    });
  }
  return c;
}

}  // namespace attention

void attend(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args, Stream stream,
            const DeviceCheck& check) {
  using namespace attention;
  check::step_shape(step);
  check_shape(plan.shape);
  check_run(plan, step, args);
  check::attention_shape(step, args);
  if (step.num_tokens == 0) return;

  AttendParams p = make_params(plan, step, args, check);
  const std::int64_t prefill_tokens = std::int64_t(step.num_tokens) - step.num_decode_tokens;
  const int group = p.group;
  const bool tiles = prefill_tokens > 0 && use_token_tiles(group, p.topk_count, p.prefill_splits);
  // Row kernel: decode rows first, then prefill rows unless they run as tiles.
  const std::int64_t row_ctas = std::int64_t(step.num_decode_tokens) * p.num_kv_heads * p.decode_splits +
                                (tiles ? 0 : prefill_tokens * p.num_kv_heads * p.prefill_splits);
  const int tokens_per_tile = tile_tokens(group, p.topk_count);
  const std::int64_t tiles_ctas =
      tiles ? tile_ctas(prefill_tokens, step.num_requests, tokens_per_tile, p.num_kv_heads) : 0;
  MSA_CHECK(row_ctas <= std::numeric_limits<std::int32_t>::max() &&
                tiles_ctas <= std::numeric_limits<std::int32_t>::max(),
            "attend: ", std::max(row_ctas, tiles_ctas),
            " CTAs exceed the grid limit (tokens x kv heads x splits)");
  // The token tiles' MMA type: the cache's for bf16 / fp16 caches, else the
  // output's (the row kernel's: row_f16).
  const bool f16 = args.out_dtype == DType::fp16;
  const auto s = static_cast<cudaStream_t>(stream);
  const bool row_mma_f16 = row_f16(args.cache.dtype, f16, p.v_scales != nullptr);
  // Row kernel: one launch per class, so that each has its own cluster size.
  const std::int64_t decode_ctas = std::int64_t(step.num_decode_tokens) * p.num_kv_heads * p.decode_splits;
  if (decode_ctas > 0) {
    AttendParams d = p;
    d.cluster_splits = use_cluster_merge(p.decode_splits) ? p.decode_splits : 0;
    launch<false>(d, args.cache.dtype, row_mma_f16, decode_ctas, s);
  }
  if (row_ctas > decode_ctas) {
    AttendParams r = p;
    r.cta_offset = decode_ctas;
    r.cluster_splits = use_cluster_merge(p.prefill_splits) ? p.prefill_splits : 0;
    launch<false>(r, args.cache.dtype, row_mma_f16, row_ctas - decode_ctas, s);
  }
  if (tiles_ctas > 0) {
    p.tile_tokens = tokens_per_tile;
    p.tile_count = tiles_ctas;
    KvMaps maps;
    // nvfp4 needs no tensor map: its producer bulk-copies the head-slot runs.
    // (The wgmma tiles load a bf16 / fp16 query's first tile through its map.)
    if (use_wgmma_tiles(true, group, tokens_per_tile) &&
        (args.cache.dtype == DType::nvfp4 || make_kv_maps(args.cache, maps)) &&
        make_query_map(args.q, args.q_dtype, step.num_tokens, p.num_q_heads, group, maps)) {
      // Whole warpgroups of output rows go out by TMA where the output can be mapped.
      make_output_map(args.out, args.out_dtype, step.num_tokens, p.num_q_heads, group, maps);
      // A step that may run key-major: the k2q plan and the device's choice
      // first; both kernels launch, the one not chosen exits at once.
      KeyMajorBuffers km;
      const bool key_major = plan.key_major_rows > 0 && is_half(args.cache.dtype);
      if (key_major) {
        km.base = static_cast<unsigned char*>(plan.workspace);
        km.layout = plan_key_major_layout(plan, step.num_requests, tokens_per_tile);
        MSA_CHECK(plan.workspace != nullptr && plan.workspace_bytes >= km.layout.end, "attend: the plan's workspace has ",
                  plan.workspace_bytes, " bytes of the ", km.layout.end, " its key-major step needs");
        const bool always = key_major_mode(static_cast<int>(plan.shape.prefill_order), true, true, step.num_tokens,
                                           step.num_decode_tokens, step.num_requests) == KeyMajorMode::always;
        prepare_key_major(km, step, args, p, tokens_per_tile, always, s, check);
        p.tile_gate = km.tile_gate();
      }
      // fp8 / nvfp4: the step's blocks widened ahead (widen.hpp), the tiles
      // then on the bf16 / fp16 kernel (per-token fp8 scales: with the
      // pages' scales, when the plan made room for them); a gated step also
      // launches the on-the-fly kernel, and the device runs one of the two.
      WidenArea widen;
      KvMaps widen_maps = maps;  // the query and output maps carry over; widened_maps sets the KV maps
      bool widened = false;
      const bool token_scales = p.k_scales != nullptr;
      if (plan.widen_pages > 0 && widens_exactly(args.cache.dtype)) {
        widen = widen_area(plan, step);
        widened = (!token_scales || widen.choice.scales) && widened_maps(widen, widen_maps);
      }
      // Split tiles (plan.tile_splits > 1, only planned for the persistent
      // kernel of a step that cannot run key-major: bf16 / fp16 caches, or
      // blocks widened ahead that surely fit): tile_splits items per tile from
      // plan.tile_split_from on, then the merge.
      const bool split_tiles =
          !key_major && plan.tile_splits > 1 && (is_half(args.cache.dtype) || (widened && !widen.choice.gated));
      if (split_tiles) {
        MSA_CHECK(plan.tile_partial_out != nullptr && plan.tile_partial_lse != nullptr,
                  "attend: the plan splits token tiles ", plan.tile_splits, " ways but has no partials");
        MSA_CHECK(plan.tile_split_from >= 0 && plan.tile_split_from <= tiles_ctas, "attend: plan.tile_split_from = ",
                  plan.tile_split_from, " is not in [0, ", tiles_ctas, "] (the step's token tiles)");
        p.tile_splits = plan.tile_splits;
        p.tile_split_from = plan.tile_split_from;
        p.tile_count = tile_split_items(tiles_ctas, TileSplit{plan.tile_splits, plan.tile_split_from});
        p.tile_partial_out = plan.tile_partial_out;
        p.tile_partial_lse = plan.tile_partial_lse;
      }
      if (widened) {
        widen_ahead(p, widen, args.cache.dtype, s);
        const AttendParams w = widened_params(p, widen);
        if (token_scales) {
          if (widen.f16) launch_attend_wgmma_tiles<KvKind::half, true, true>(w, widen_maps, s);
          else launch_attend_wgmma_tiles<KvKind::half, false, true>(w, widen_maps, s);
        } else {
          if (widen.f16) launch_attend_wgmma_tiles<KvKind::half, true>(w, widen_maps, s);
          else launch_attend_wgmma_tiles<KvKind::half, false>(w, widen_maps, s);
        }
        if (widen.choice.gated) p.tile_gate = widen.gates() + 1;
      }
      if (!widened || widen.choice.gated) {
        dispatch(args.cache.dtype, f16, "attend", [&](auto kind, auto fp16) {
          constexpr KvKind kKind = decltype(kind)::value;
          launch_attend_wgmma_tiles<kKind, decltype(fp16)::value>(p, maps, s);
        });
      }
      if (split_tiles) combine_tile_splits(p, s);
      if (key_major) {
        AttendParams k = p;
        k.tile_count = km.layout.max_items;
        k.tile_gate = km.key_major_gate();
        k.km_items = km.items();
        k.km_tokens = km.tokens();
        k.km_slots = km.slots();
        k.km_partial_out = km.partial_out();
        k.km_partial_lse = km.partial_lse();
        // The MMA type is the cache's.
        if (args.cache.dtype == DType::fp16) launch_attend_key_major<true>(k, maps, s);
        else launch_attend_key_major<false>(k, maps, s);
        combine_key_major(km, k, s);
      }
    } else {
      p.tile_pass_keys = tile_pass_keys();
      launch<true>(p, args.cache.dtype, f16, tiles_ctas, s);
    }
  }
}

}  // namespace msa::cuda
