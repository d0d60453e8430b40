// The record of a CUDA attention plan: the problem it is for, the tuning it
// was made with, what it decided for the step (kernel family per row class,
// splits, tile splits, widening) and the map of its workspace. plan_attention
// fills it (src/cuda/attention/host/schedule.hpp); attend() runs it as it is.
// Plain values, for tools and tests to read; docs/DESIGN.md explains each
// decision and the workspace map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "msa/batch.hpp"
#include "msa/dtype.hpp"
#include "msa/ops.hpp"

namespace msa::cuda {

struct Workspace;

// How the prefill rows of a step run when they run as token tiles on a bf16 /
// fp16 cache and the step has no decode rows (otherwise always query-major).
// Key-major is faster than the token tiles when neighbouring tokens select
// unrelated blocks, and slower when they share them (what models produce).
enum class PrefillOrder : std::int32_t {
  query_major = 0,  // token tiles: T consecutive tokens and the union of their blocks
  key_major = 1,    // work items of one block and the tokens that selected it (the k2q plan), then a merge
  automatic = 2,    // steps of >= key_major_min_tokens tokens build the k2q plan and the device picks per step
};

// Which token-tile kernel the prefill rows may run on.
enum class TileKernel : std::int32_t {
  automatic = 0,  // the wgmma tiles where the shape allows them, else the mma.sync tiles
  mma_sync = 1,   // always the mma.sync tiles (tests and comparisons)
};

// The knobs of a plan: how it runs the problem, never what it computes. The
// defaults are the tuned choices; each other value gives the same results.
struct AttentionTuning {
  PrefillOrder prefill_order = PrefillOrder::query_major;
  // PrefillOrder::automatic: steps of at least this many tokens may run
  // key-major (the k2q plan costs tens of microseconds whichever kernel runs).
  std::int64_t key_major_min_tokens = 8192;
  // Split-K factor of the decode / verify rows: 0 lets the plan choose, 1-16 forces it.
  std::int32_t decode_splits = 0;
  // The same for the prefill rows (1 runs them as token tiles where the shape allows).
  std::int32_t prefill_splits = 0;
  // Ways each prefill token tile's block union is split on the persistent
  // wgmma kernel: 0 lets the plan choose, 1-4 forces that many on every tile.
  std::int32_t tile_splits = 0;
  // > 0: the SM count the tile-split rule assumes instead of the device's.
  std::int32_t tile_split_sms = 0;
  // fp8 / nvfp4 prefill tiles: at most this many bytes of blocks widened ahead
  // into the workspace (bf16 / fp16, once per selected (request, block, KV
  // head)); -1: 1 GiB, 0: never (the tiles widen on the fly). A step that may
  // select more than fit counts them on the device and widens on the fly when
  // they do not fit.
  std::int64_t widen_bytes = -1;
  TileKernel tile_kernel = TileKernel::automatic;

  bool operator==(const AttentionTuning&) const = default;
};

// What a plan computes, from the arguments' plain fields.
struct AttentionProblem {
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;  // cache.num_kv_heads
  std::int32_t topk = 0;          // topk.topk
  DType q_dtype = DType::bf16;
  DType kv_dtype = DType::bf16;   // cache.dtype
  DType out_dtype = DType::bf16;
  bool kv_token_scales = false;   // an fp8 cache with per_token_head scales

  static AttentionProblem of(const AttentionArgs& args);
  bool operator==(const AttentionProblem&) const = default;
};

// How the prefill rows of a step run (docs/DESIGN.md, the kernel families).
enum class PrefillKernel : std::int32_t {
  none = 0,            // the step has no prefill rows
  rows = 1,            // the row kernel, like decode rows (rows that split, or no token tiles for the shape)
  mma_sync_tiles = 2,  // token tiles on mma.sync
  wgmma_tiles = 3,     // token tiles on wgmma (bf16 / fp16: persistent CTAs; fp8 / nvfp4: widened in the CTA)
  widened_tiles = 4,   // fp8 / nvfp4 blocks widened ahead, then the bf16 / fp16 wgmma tiles over them
                       // (widen_gated: the device runs wgmma_tiles instead when they do not fit)
  key_major = 5,       // the k2q plan, then key-major work items or the wgmma tiles, the device's choice
};

// Where each piece of a plan lives in its workspace: byte offsets from the
// start, laid out in this order by one bump allocator; a piece the schedule
// does not use has no bytes (its offset is where it would start).
struct AttentionWorkspaceMap {
  // Split rows that merge through the workspace (decode rows, split prefill
  // rows), tokens from 0 up to the last class that splits.
  std::int64_t partial_tokens = 0;
  std::int32_t max_splits = 1;
  std::size_t partial_out = 0;    // fp32 [partial_tokens, num_q_heads, max_splits, 128]
  std::size_t partial_lse = 0;    // fp32 [partial_tokens, num_q_heads, max_splits]
  std::size_t counters = 0;       // int32 [partial_tokens, num_kv_heads] finished splits; the plan
  std::size_t counter_bytes = 0;  //   zeroes them, the last split of a row sets its counter back to 0
  // Split token tiles.
  std::size_t tile_partial_out = 0;  // 16-bit [num_tokens, num_q_heads, tile_splits, 128]
  std::size_t tile_partial_lse = 0;  // fp32 [num_tokens, num_q_heads, tile_splits]; +inf: a whole tile
  // Key-major steps: the k2q plan (msa::cuda::build_k2q), its scratch, the work
  // items, the device's choice and the per-edge partials.
  std::int64_t k2q_edges = 0;        // num_tokens x num_kv_heads x topk
  std::int64_t km_max_items = 0;
  std::size_t k2q_offsets = 0;       // int64 [num_kv_heads x key_major_rows + 1]
  std::size_t k2q_tokens = 0;        // int32 [k2q_edges]
  std::size_t k2q_slots = 0;         // int32 [k2q_edges]
  std::size_t k2q_counts = 0;        // int32 [num_tokens, num_kv_heads]
  std::size_t k2q_scratch = 0, k2q_scratch_bytes = 0;
  std::size_t km_items = 0;          // 32-byte work items [km_max_items]
  std::size_t km_stats = 0;          // int64 [5]: items, tile rounds, key-major gate, token-tile gate, CTAs done
  std::size_t km_partial_out = 0;    // 16-bit [num_tokens, topk, num_q_heads, 128]
  std::size_t km_partial_lse = 0;    // fp32 [num_tokens, topk, num_q_heads]
  // Widened blocks (fp8 / nvfp4 prefill tiles).
  std::size_t widen_table = 0;       // int32 [widen_first_request + widen_requests][widen_block_cap] page of (request, block)
  std::size_t widen_counters = 0;    // int32 [4]: pages claimed - 1, (request, head, block) triples claimed - 1
  std::size_t widen_claims = 0;      // int32 [widen_requests][num_kv_heads][widen_block_cap]
  std::size_t widen_fill = 0, widen_fill_bytes = 0;  // what one 0xff fill resets (prefill table rows .. claims)
  std::size_t widen_items = 0;       // int32 [widen_pages x num_kv_heads][4] request, block, head, cache page
  std::size_t widen_gates = 0;       // int64 [2] tiles of the widened and the on-the-fly kernel (gated steps)
  std::size_t widen_k = 0;           // [widen_pages][num_kv_heads][128][128] 16-bit, 1 KiB aligned
  std::size_t widen_v = 0;           // the same for V
  std::size_t widen_scales = 0;      // fp32 [widen_pages][num_kv_heads][2][128] (widen_scales)
  std::size_t bytes = 0;             // the whole workspace

  bool operator==(const AttentionWorkspaceMap&) const = default;
};

// What a plan decided for its step.
struct AttentionSchedule {
  AttentionProblem problem;
  AttentionTuning tuning;
  std::int32_t num_tokens = 0;
  std::int32_t num_decode_tokens = 0;
  std::int32_t num_requests = 0;  // steps with token tiles (else 0)
  // The row kernel: decode rows, then prefill rows when prefill == rows. A
  // class whose rows split merges in thread-block clusters of its split count
  // (cluster > 1) or through the workspace (cluster 0).
  std::int32_t decode_splits = 1;
  std::int32_t prefill_splits = 1;
  std::int32_t decode_cluster = 0;
  std::int32_t prefill_cluster = 0;
  bool row_f16 = false;           // the row kernel's MMA type: fp16, else bf16
  std::int64_t decode_ctas = 0;   // row-kernel CTAs of the decode rows
  std::int64_t prefill_ctas = 0;  // and of the prefill rows (prefill == rows)
  // The prefill rows.
  PrefillKernel prefill = PrefillKernel::none;
  std::int32_t tile_tokens = 0;   // tokens per token tile
  std::int64_t tiles = 0;         // token-tile numbers x KV heads
  // Split tiles (> 1): tiles numbered from tile_split_from on run as
  // tile_splits work items each, merged per row afterwards.
  std::int32_t tile_splits = 1;
  std::int64_t tile_split_from = 0;
  // Key-major: the k2q rows per KV head (sum over requests of ceil(seq_len /
  // 128)), and whether it runs whatever the device would choose.
  std::int64_t key_major_rows = 0;
  bool key_major_always = false;
  // Widened blocks: room for widen_pages (request, block) pages.
  std::int64_t widen_pages = 0;
  bool widen_gated = false;
  std::int32_t widen_first_request = 0;  // the step's first prefill request
  std::int32_t widen_requests = 0;       // its prefill requests
  std::int32_t widen_block_cap = 0;      // blocks of its longest prefill request
  bool widen_scales = false;             // the pages carry per-token scales
  AttentionWorkspaceMap map;

  bool operator==(const AttentionSchedule&) const = default;
};

}  // namespace msa::cuda
