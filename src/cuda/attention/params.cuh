// The one flat parameter struct of the attention kernels (built by attend.cu
// from the plan, the step and the arguments) and the compile-time choices of
// a kernel instance.
#pragma once

#include <cstdint>

#include "cuda/attention/kv_format.hpp"
#include "msa/cache.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::attention {

// Query element types (runtime: the query is converted once per CTA).
enum QueryKind : int { kQueryBf16 = 0, kQueryFp16 = 1, kQueryE4m3 = 2 };

inline constexpr int kThreads = 128;      // 4 warps per CTA
inline constexpr int kRows = 16;          // query rows per CTA (a GQA group, padded)
inline constexpr int kMaxEntries = 64;    // largest top-k

// A key-major work item: `count` tokens of one k2q row (KV head `head`,
// request `request`, block `block`), the plan's edges edge .. edge + count - 1.
struct KeyMajorItem {
  std::int32_t head, request, block, edge, count, pad[3];
};

struct AttendParams {
  // ---- queries and outputs ----
  const void* q = nullptr;  // [num_tokens, num_q_heads, 128] q_kind
  int q_kind = kQueryBf16;
  void* out = nullptr;      // [num_tokens, num_q_heads, 128] bf16 or fp16 (out_fp16)
  int out_fp16 = 0;
  float* lse = nullptr;     // [num_tokens, num_q_heads] natural log; may be null
  float* partial_out = nullptr;  // [partial_tokens, num_q_heads, max_splits, 128] fp32
  float* partial_lse = nullptr;  // [partial_tokens, num_q_heads, max_splits] fp32
  int* counters = nullptr;       // [partial_tokens, num_kv_heads] finished splits, 0 between calls
  int max_splits = 1;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int group = 1;            // query heads per KV head, 1..16
  // scale * log2(e) * (per-tensor K scale or nvfp4 K global scale) * q_scale
  float score_scale_log2 = 0.0f;
  // per-tensor V scale or nvfp4 V global scale (1 otherwise)
  float out_scale = 1.0f;

  // ---- the step (device copies) ----
  int num_tokens = 0;
  int num_decode_tokens = 0;
  int num_requests = 0;
  const std::int32_t* query_start = nullptr;    // [num_requests + 1]
  const std::int32_t* seq_lens = nullptr;       // [num_requests]
  const std::int32_t* token_request = nullptr;  // [num_tokens]

  // ---- the views of the arguments (include/msa/cache.hpp, ops.hpp): every
  // address of the top-k lists, the cache and the block table comes from their
  // row / offset / at functions ----
  // [num_tokens, num_kv_heads, topk.topk]: entry (t, h, k) at topk.row(t, h)[k]
  TopkView topk;
  // K element (page, head, token, d) at cache.k + cache.offset(page, head,
  // token, d) (elements of the cache dtype); nvfp4: byte-addressed head slots
  // (nvfp4::slot_offset). k_scales / v_scales: per_token_head fp8
  // [num_pages * 128, num_kv_heads], else null; over widened pages (the scaled
  // token tiles, widen/widen.hpp) k_scales is [pages][num_kv_heads][2 (K, V)][128].
  KVCacheView cache;
  // The page of (request r, block b): table.at(r, b).
  BlockTable table;

  // ---- work split ----
  int decode_splits = 1;
  int prefill_splits = 1;
  int tile_tokens = 0;       // token-tile launch: tokens per tile (heuristics.hpp), else 0
  std::int64_t tile_count = 0;  // token-tile launch: tile numbers x KV heads (heuristics.hpp, tile_ctas)
  // wgmma tile launches of a step that may run key-major: the launch runs
  // min(tile_count, *tile_gate) tiles (the device's choice, key_major.cu); null: tile_count.
  const std::int64_t* tile_gate = nullptr;
  // Split token tiles (tile_splits > 1): tile_count counts work items; items
  // below tile_split_from are those tiles whole (their rows go to out / lse,
  // and lse slot 0 of their partials is +inf: "not split"), item
  // tile_split_from + n is split n % tile_splits of tile tile_split_from +
  // n / tile_splits, whose rows go to the partials (the workspace map;
  // shared/tile_scheduler.cuh, tile_item).
  int tile_splits = 1;
  std::int64_t tile_split_from = 0;
  void* tile_partial_out = nullptr;  // [num_tokens, num_q_heads, tile_splits, 128] out dtype
  float* tile_partial_lse = nullptr;  // [num_tokens, num_q_heads, tile_splits]
  // ---- key-major launch (tile = work item; msa/cuda_schedule.hpp, the workspace map) ----
  const KeyMajorItem* km_items = nullptr;   // [tile_count]
  const std::int32_t* km_tokens = nullptr;  // [edges] the k2q plan's tokens
  const std::int32_t* km_slots = nullptr;   // [edges] their slots
  void* km_partial_out = nullptr;         // [num_tokens, topk.topk, num_q_heads, 128] out dtype
  float* km_partial_lse = nullptr;        // [num_tokens, topk.topk, num_q_heads]
  // Row-kernel launch: CTA blockIdx.x is row-kernel CTA cta_offset + blockIdx.x
  // (decode and prefill rows launch apart). cluster_splits > 1: the launch's
  // CTAs form clusters of that many, one row's splits, merged through
  // distributed shared memory instead of the workspace (0: the workspace).
  std::int64_t cta_offset = 0;
  int cluster_splits = 0;

  std::int64_t* check = nullptr;  // [8] DeviceCheck buffer, or null
};

}  // namespace msa::cuda::attention
