// Plan step of the CUDA sparse attention: validates the shape, readies the
// kernels, chooses the split-K factors (heuristics.hpp, knowing the device's
// cluster capacities), lays out the caller's workspace and enqueues the zeroing
// of its split counters on the stream. A decode-only step's plan depends only
// on the shape, the token counts and the device, never on sequence lengths,
// top-k lists or block tables, so a captured decode graph stays valid while
// those change (a prefill step's key-major rows and widened blocks depend on
// its requests' lengths).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/attention/heuristics.hpp"
#include "cuda/attention/plan_internal.hpp"
#include "cuda/attention/widen_layout.hpp"
#include "cuda/common/check.cuh"
#include "msa/common.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace attention {

void check_shape(const AttentionShape& s) {
  MSA_CHECK(s.num_kv_heads >= 1, "attention shape: num_kv_heads = ", s.num_kv_heads,
            " but must be at least 1");
  MSA_CHECK(s.num_q_heads >= 1 && s.num_q_heads % s.num_kv_heads == 0,
            "attention shape: num_q_heads = ", s.num_q_heads,
            " is not a positive multiple of num_kv_heads = ", s.num_kv_heads);
  const int group = s.num_q_heads / s.num_kv_heads;
  MSA_CHECK(group <= kMaxGroup, "attention shape: GQA group num_q_heads / num_kv_heads = ", group,
            " but at most ", kMaxGroup, " is supported");
  MSA_CHECK(s.topk >= 1 && s.topk <= kMaxTopk, "attention shape: topk = ", s.topk,
            " is not in [1, ", kMaxTopk, "]");
  MSA_CHECK(is_half(s.q_dtype) || s.q_dtype == DType::fp8_e4m3, "attention shape: q_dtype = ",
            dtype_name(s.q_dtype), " but queries are bf16, fp16 or fp8_e4m3");
  MSA_CHECK(is_half(s.out_dtype), "attention shape: out_dtype = ", dtype_name(s.out_dtype),
            " but outputs are bf16 or fp16");
  MSA_CHECK(!is_half(s.q_dtype) || s.out_dtype == s.q_dtype, "attention shape: out_dtype = ",
            dtype_name(s.out_dtype), " but a ", dtype_name(s.q_dtype),
            " query gives an output of the same dtype");
  const auto order = static_cast<std::int32_t>(s.prefill_order);
  MSA_CHECK(order >= 0 && order <= 2, "attention shape: prefill_order = ", order,
            " is not query_major (0), key_major (1) or automatic (2)");
  MSA_CHECK(s.decode_splits >= 0 && s.decode_splits <= kMaxSplits, "attention shape: decode_splits = ",
            s.decode_splits, " is not in [0, ", kMaxSplits, "] (0: the plan chooses)");
  MSA_CHECK(s.tile_splits >= 0 && s.tile_splits <= kMaxTileSplits, "attention shape: tile_splits = ",
            s.tile_splits, " is not in [0, ", kMaxTileSplits, "] (0: the plan chooses)");
  MSA_CHECK(s.widen_bytes >= -1, "attention shape: widen_bytes = ", s.widen_bytes,
            " but must be -1 (the default limit), 0 (never widen ahead) or a byte limit");
  MSA_CHECK(is_half(s.kv_dtype) || is_fp8(s.kv_dtype) || s.kv_dtype == DType::nvfp4,
            "attention shape: kv_dtype = ", dtype_name(s.kv_dtype),
            " but the KV cache is bf16, fp16, fp8_e4m3, fp8_e5m2 or nvfp4");
}

namespace {

void check_meta(const BatchMetadata& meta) {
  MSA_CHECK(meta.num_tokens >= 0 && meta.num_decode_tokens >= 0 &&
                meta.num_decode_tokens <= meta.num_tokens,
            "attention plan: num_decode_tokens = ", meta.num_decode_tokens,
            " is not in [0, num_tokens = ", meta.num_tokens, "]");
}

// Readies the shape's kernels, then splits rows knowing which factors can
// merge in thread-block clusters on this device.
Splits step_splits(const BatchMetadata& meta, const AttentionShape& shape) {
  prepare_kernels(shape);
  // choose_splits' cost model counts one CTA per SM, so its clusters fit when
  // they do at one CTA per SM, also for fp8 rows of per-tensor scales, whose
  // kernel fits two (16/1 fp8 decode, batch 32, one sweep on the H200: 15.4 us
  // at 3 splits, 16.9 at the 4 that its own capacity lets the model pick).
  const bool converted =
      row_converts_slowly(shape.kv_dtype, shape.out_dtype == DType::fp16, shape.kv_token_scales);
  Splits s = choose_step_splits(meta.num_tokens, meta.num_decode_tokens, shape.num_kv_heads, shape.topk,
                                device_sm_count(), cluster_capacity(shape, !converted), converted,
                                row_kernel_ctas_per_sm(shape.kv_dtype));
  if (shape.decode_splits > 0 && meta.num_decode_tokens > 0) s.decode = shape.decode_splits;
  return s;
}

// Rows per KV head of the step's k2q plan when the step may run key-major
// (heuristics.hpp, key_major_mode), else 0.
std::int64_t key_major_rows(const BatchMetadata& meta, const AttentionShape& shape) {
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const int tokens = tile_tokens(group, shape.topk);
  const bool half = is_half(shape.kv_dtype);
  // (Prefill rows run as tiles when they do not split, which steps of
  // kKeyMajorMinTokens tokens never do; attend() checks the plan's split.)
  const bool wgmma = meta.num_tokens > meta.num_decode_tokens && use_token_tiles(group, shape.topk, 1) &&
                     use_wgmma_tiles(half, group, tokens);
  if (key_major_mode(static_cast<int>(shape.prefill_order), half, wgmma, meta.num_tokens, meta.num_decode_tokens,
                     meta.num_requests) == KeyMajorMode::off)
    return 0;
  std::int64_t rows = 0;
  for (std::int32_t r = 0; r < meta.num_requests && r < std::int32_t(meta.seq_lens.size()); ++r)
    rows += meta.num_blocks(r);
  return rows;
}

// Whether the step's fp8 / nvfp4 prefill tiles read blocks widened ahead,
// and the room for them (widen_layout.hpp, choose_widen).
WidenChoice step_widen(const BatchMetadata& meta, const AttentionShape& shape, const Splits& splits) {
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const bool tiles = meta.num_tokens > meta.num_decode_tokens && use_token_tiles(group, shape.topk, splits.prefill) &&
                     use_wgmma_tiles(true, group, tile_tokens(group, shape.topk));
  std::vector<std::int32_t> query_lens, blocks;
  for (std::int32_t r = meta.num_decodes; r < meta.num_requests; ++r) {
    query_lens.push_back(meta.query_start[std::size_t(r) + 1] - meta.query_start[std::size_t(r)]);
    blocks.push_back(meta.num_blocks(r));
  }
  return choose_widen(shape.kv_dtype, shape.kv_token_scales, tiles, shape.widen_bytes, shape.num_kv_heads,
                      shape.topk, meta.num_decodes, query_lens, blocks);
}

// How the step's prefill token tiles split (heuristics.hpp,
// choose_tile_split): only tiles of the persistent wgmma kernel (bf16 / fp16
// caches, or blocks widened ahead that surely fit) of a step that cannot run
// key-major; shape.tile_splits forces every tile to split that many ways.
TileSplit step_tile_split(const BatchMetadata& meta, const AttentionShape& shape, const Splits& splits,
                          std::int64_t km_rows, const WidenChoice& widen) {
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const int tokens = tile_tokens(group, shape.topk);
  const std::int64_t prefill = std::int64_t(meta.num_tokens) - meta.num_decode_tokens;
  const bool persistent = is_half(shape.kv_dtype) || (widen.pages > 0 && !widen.gated);
  if (prefill <= 0 || km_rows > 0 || !persistent || !use_token_tiles(group, shape.topk, splits.prefill) ||
      !use_wgmma_tiles(true, group, tokens))
    return {};
  if (shape.tile_splits > 0) return {shape.tile_splits, 0};
  const int sms_override = tile_split_sms_override.load(std::memory_order_relaxed);
  return choose_tile_split(tile_ctas(prefill, meta.num_requests, tokens, shape.num_kv_heads),
                           sms_override > 0 ? sms_override : device_sm_count(), shape.num_kv_heads);
}

// Where the widened blocks start: after the split partials and the split
// tiles' partials (a step that widens never runs key-major).
std::size_t widen_start(const BatchMetadata& meta, const AttentionShape& shape, const Splits& splits,
                        int tile_splits) {
  const std::size_t split_bytes =
      workspace_layout(meta.num_tokens, meta.num_decode_tokens, shape.num_q_heads, shape.num_kv_heads, splits).bytes;
  return tile_split_layout(split_bytes, meta.num_tokens, shape.num_q_heads, tile_splits).end;
}

// Bytes of the whole workspace: the split partials, then the key-major data or
// the split tiles' partials and the widened blocks.
std::size_t workspace_end(const BatchMetadata& meta, const AttentionShape& shape, const Splits& splits,
                          std::int64_t km_rows, int tile_splits, const WidenChoice& widen) {
  if (km_rows <= 0)
    return widen_layout(widen_start(meta, shape, splits, tile_splits), widen, shape.num_kv_heads).end;
  const std::size_t split_bytes =
      workspace_layout(meta.num_tokens, meta.num_decode_tokens, shape.num_q_heads, shape.num_kv_heads, splits).bytes;
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const std::size_t k2q = k2q_workspace_bytes(meta.num_tokens, meta.num_requests, shape.num_kv_heads, shape.topk, km_rows);
  return key_major_layout(split_bytes, meta.num_tokens, shape.num_q_heads, shape.num_kv_heads, shape.topk, km_rows,
                          tile_tokens(group, shape.topk), k2q)
      .end;
}

}  // namespace
}  // namespace attention

std::size_t attention_workspace_bytes(const BatchMetadata& meta, const AttentionShape& shape) {
  attention::check_shape(shape);
  attention::check_meta(meta);
  const attention::Splits splits = attention::step_splits(meta, shape);
  const std::int64_t km_rows = attention::key_major_rows(meta, shape);
  const attention::WidenChoice widen = attention::step_widen(meta, shape, splits);
  return attention::workspace_end(meta, shape, splits, km_rows,
                                  attention::step_tile_split(meta, shape, splits, km_rows, widen).splits, widen);
}

AttentionPlan plan_attention(const BatchMetadata& meta, const AttentionShape& shape, void* workspace,
                             std::size_t workspace_bytes, Stream stream) {
  attention::check_shape(shape);
  attention::check_meta(meta);
  const attention::Splits splits = attention::step_splits(meta, shape);
  const attention::WorkspaceLayout layout =
      attention::workspace_layout(meta.num_tokens, meta.num_decode_tokens, shape.num_q_heads,
                                  shape.num_kv_heads, splits);
  MSA_CHECK(workspace_bytes >= layout.bytes, "attention plan: workspace_bytes = ", workspace_bytes,
            " but the plan needs ", layout.bytes, " (", layout.partial_tokens, " tokens x ",
            shape.num_q_heads, " heads x ", layout.max_splits, " splits of fp32 partials)");
  const std::int64_t km_rows = attention::key_major_rows(meta, shape);
  const attention::WidenChoice widen = attention::step_widen(meta, shape, splits);
  const attention::TileSplit tile_split = attention::step_tile_split(meta, shape, splits, km_rows, widen);
  const int tile_splits = tile_split.splits;
  const std::size_t needed = attention::workspace_end(meta, shape, splits, km_rows, tile_splits, widen);
  MSA_CHECK(workspace_bytes >= needed, "attention plan: workspace_bytes = ", workspace_bytes, " but the plan needs ",
            needed, " (the key-major plan, work items and partials, the split tiles' partials, or the widened ",
            "blocks, of a ", meta.num_tokens, "-token prefill step: see attention_workspace_bytes)");
  MSA_CHECK(needed == 0 || workspace != nullptr, "attention plan: workspace is null but ", needed,
            " bytes are needed");
  MSA_CHECK(reinterpret_cast<std::uintptr_t>(workspace) % 16 == 0,
            "attention plan: workspace must be 16-byte aligned");

  AttentionPlan plan;
  plan.shape = shape;
  plan.num_tokens = meta.num_tokens;
  plan.num_decode_tokens = meta.num_decode_tokens;
  plan.decode_splits = splits.decode;
  plan.prefill_splits = splits.prefill;
  plan.workspace = workspace;
  plan.workspace_bytes = workspace_bytes;
  plan.key_major_rows = km_rows;
  plan.tile_splits = tile_splits;
  plan.tile_split_from = tile_split.from;
  plan.widen_pages = widen.pages;
  plan.widen_gated = widen.gated;
  plan.widen_first_request = widen.first_request;
  plan.widen_requests = widen.requests;
  plan.widen_block_cap = widen.block_cap;
  plan.widen_offset = widen.pages > 0 ? attention::widen_start(meta, shape, splits, tile_splits) : 0;
  if (tile_splits > 1) {
    const attention::TileSplitLayout t =
        attention::tile_split_layout(layout.bytes, meta.num_tokens, shape.num_q_heads, tile_splits);
    auto* base = static_cast<unsigned char*>(workspace);
    plan.tile_partial_out = base + t.out_offset;
    plan.tile_partial_lse = reinterpret_cast<float*>(base + t.lse_offset);
  }
  if (layout.bytes > 0) {
    auto* base = static_cast<unsigned char*>(workspace);
    plan.partial_out = reinterpret_cast<float*>(base + layout.out_offset);
    plan.partial_lse = reinterpret_cast<float*>(base + layout.lse_offset);
    // The split counters start at 0; attend() leaves them at 0 again.
    MSA_CUDA_CHECK(cudaMemsetAsync(base + layout.counter_offset, 0, layout.counter_bytes,
                                   static_cast<cudaStream_t>(stream)));
  }
  return plan;
}

}  // namespace msa::cuda
