// Host heuristics of the CUDA sparse attention: how many ways the selected
// blocks of one (token, KV head) row are split across CTAs and how split rows
// merge, whether prefill rows run as token tiles (and on which kernel), how
// tiles split, when a step may run key-major. Pure functions with no CUDA
// includes, so the CPU unit tests (tests/unit/test_attention_plan.cpp) check
// them directly; make_schedule (schedule.hpp) applies them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cuda/attention/kv_format.hpp"
#include "msa/cache.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"

namespace msa::cuda::attention {

// Largest split-K factor. Partial results are [rows, heads, splits, 128] fp32.
inline constexpr int kMaxSplits = 16;
// CTAs of the row kernel that fit on one SM, by the cache's format
// (kv_format.hpp): bf16 / fp16 stages hold three 64 KiB K/V tiles, so one;
// fp8 and nvfp4 read three raw stages (32 or 18 KiB) without a widened tile: two.
constexpr int row_kernel_ctas_per_sm(DType kv) { return kv_format(kv_kind(kv)).row_ctas_per_sm; }
inline constexpr int kCtasPerSm = row_kernel_ctas_per_sm(DType::bf16);

// Whether the row kernel runs on fp16 MMA (attend.cu dispatches on it). It
// runs fp8 and nvfp4 caches on fp16 MMA whatever the output dtype: their codes
// become fp16 in one instruction per pair, where bf16 takes four, and bf16
// query rows are scaled into fp16's range (query_scale.hpp). Per-token fp8 V
// scales multiply the probabilities in the MMA type, where fp16's range could
// overflow: those rows keep the output's type, as the token-tile kernels do.
constexpr bool row_f16(DType kv, bool out_f16, bool token_v_scales) {
  return out_f16 || (kv != DType::bf16 && kv != DType::fp16 && !token_v_scales);
}
// The row-kernel instances that can launch (and so are built): nvfp4 caches
// have no per-token scales (check_problem), so row_f16 puts every nvfp4 row
// on fp16 MMA and the nvfp4 instance on bf16 MMA never runs.
constexpr bool row_instance_built(KvKind kind, bool f16) { return f16 || kind != KvKind::nvfp4; }
static_assert(row_f16(DType::nvfp4, false, false), "row_instance_built: nvfp4 rows run on fp16 MMA");

// Whether the row kernel spends several instructions per pair of codes
// converting a block (choose_converted_splits): nvfp4 caches, and fp8 caches
// whose rows stay on bf16 MMA (row_f16).
constexpr bool row_converts_slowly(DType kv, bool out_f16, bool token_v_scales) {
  return kv == DType::nvfp4 ||
         ((kv == DType::fp8_e4m3 || kv == DType::fp8_e5m2) && !row_f16(kv, out_f16, token_v_scales));
}

// Split rows whose factor is at most this merge inside a thread-block cluster
// (the splits of a row are one cluster, partials exchanged through distributed
// shared memory: no workspace round trips) when all the launch's clusters fit
// on the device at once; otherwise they merge through the workspace. 8 is the
// portable cluster size.
inline constexpr int kMaxClusterSplits = 8;
inline bool use_cluster_merge(int splits) { return splits > 1 && splits <= kMaxClusterSplits; }
// Both split rules plan clusters up to kMaxClusterSplits: on the H200 8-way
// clusters were the fastest bf16 decode at batch 1 and 8 (16 / 1 and 64 / 4
// heads, splits 3-8 and 16 timed; bench/RESULTS.md in git history). The GPU
// tests run splits 1-6 and 8 in clusters and 9 / 16 through the workspace
// (ForcedSplits, ShapeDecodeSplits).

// Clusters of each size (2..kMaxClusterSplits) of the row kernel that the
// device holds at once (cudaOccupancyMaxActiveClusters); all 0: no cluster merge.
struct ClusterCapacity {
  int clusters[kMaxClusterSplits + 1] = {};
  // Whether `rows` rows split `splits` ways merge in clusters (one wave of them).
  bool fits(int splits, std::int64_t rows) const {
    return use_cluster_merge(splits) && rows <= clusters[splits];
  }
};

// Cost model of a row-kernel launch, in "blocks" (the time one CTA takes to
// stream one 64 KiB K/V block, ~1.4 us on the H200), fitted to decode timings
// on the H200 (16 / 1 heads, top-k 16, batch 1-64, split 1-16; F3):
//   per CTA: the metadata chain, first-load latency and epilogue (~5.7 us);
inline constexpr double kCtaOverheadBlocks = 4.0;
//   per split launch merging through the workspace: partial stores, fence,
//   counter, partial reads of the last split (~6.6 us at the end of the launch);
inline constexpr double kWorkspaceMergeBlocks = 4.7;
//   per split launch merging in clusters (pushes into the owning split's shared
//   memory; raw fp8: two cluster barriers and DSMEM reads);
inline constexpr double kClusterMergeBlocks = 0.1;
//   per block of the whole launch when HBM bandwidth (~4.3 TB/s) is the limit.
inline constexpr double kBandwidthBlocks = 0.0109;

// Split-K factor for `rows` (token, KV head) rows that each read up to `topk`
// blocks, on `num_sms` SMs. Minimises max(waves x (blocks per CTA + CTA
// overhead), the bandwidth floor) + the merge cost; ties go to fewer splits.
// With a cluster capacity, factors up to kMaxClusterSplits whose clusters fit
// in one wave get the cheap cluster merge (decode at one KV head: batch 1-16
// 8 splits, batch 32 3 on the H200); without one every split pays the
// workspace merge (batch 32: 4, batch 1-8: 16). Large batches and prefill get 1.
inline int choose_splits(std::int64_t rows, int topk, int num_sms, const ClusterCapacity& capacity = {},
                         int ctas_per_sm = kCtasPerSm) {
  if (rows <= 0 || topk <= 1 || num_sms <= 0) return 1;
  const std::int64_t slots = std::int64_t(num_sms) * std::max(ctas_per_sm, 1);
  const int max_splits = std::min(topk, kMaxSplits);
  const double bandwidth_floor = double(rows) * topk * kBandwidthBlocks + kCtaOverheadBlocks;
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const std::int64_t waves = (rows * s + slots - 1) / slots;
    const int blocks = (topk + s - 1) / s;
    double cost = std::max(double(waves) * (blocks + kCtaOverheadBlocks), bandwidth_floor);
    if (s > 1)
      cost += capacity.fits(s, rows) ? kClusterMergeBlocks : kWorkspaceMergeBlocks;
    if (s == 1 || cost < best_cost - 1e-9) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

// ---- token tiles (prefill) --------------------------------------------------------
// A token-tile CTA (8 warps, 16 query rows each) takes T consecutive tokens of
// one request and one KV head: rows T x G, token-major. It loads each block of
// the union of the tokens' selections once and masks every row to its own
// token's blocks, so with clustered selections (neighbouring tokens share most
// blocks) each K/V tile feeds up to 8 times more MMA rows than in the row kernel.
inline constexpr int kTileRows = 128;       // MMA rows of a token tile (8 warps x 16)
inline constexpr int kTileMaxTokens = 64;   // token masks are 64-bit
inline constexpr int kTileMaxPairs = 512;   // (token, top-k entry) pairs scanned per tile

// Tokens per tile for GQA group `group` and `topk` entries per row.
inline int tile_tokens(int group, int topk) {
  const int by_rows = kTileRows / std::max(group, 1);
  const int by_pairs = kTileMaxPairs / std::max(topk, 1);
  return std::max(1, std::min({by_rows, kTileMaxTokens, by_pairs}));
}

// Prefill rows run as token tiles when they need no split-K (the prefill part is
// large enough to fill the machine, see choose_splits) and a tile holds at least
// 32 MMA rows. The host cannot see the top-k lists; when neighbouring tokens
// select unrelated blocks the tile kernel loads about as many tiles as the row
// kernel and only the warps whose tokens selected a block compute on it.
inline bool use_token_tiles(int group, int topk, int prefill_splits) {
  return prefill_splits == 1 && group * tile_tokens(group, topk) >= 32;
}

// Tile numbers: the j-th tile of request r is number first_tile_number(r) + j,
// floor(a_r / T) + r with a_r the offset of r's first prefill token among the
// prefill tokens (0 for decode requests), so that no two tiles collide whatever
// the query lengths are; the numbers stay below prefill_tokens / T + requests
// (a few stay unused and their CTAs exit at once). Host and device.
//   query_start_r: query_start[r]
MSA_HD std::int64_t first_tile_number(int query_start_r, int num_decode_tokens, int tokens_per_tile, int r) {
  const int a = (query_start_r > num_decode_tokens ? query_start_r : num_decode_tokens) - num_decode_tokens;
  return std::int64_t(a / tokens_per_tile) + r;
}

// CTAs of the token-tile launch (tile numbers x KV heads, head fastest).
inline std::int64_t tile_ctas(std::int64_t prefill_tokens, int num_requests, int tokens_per_tile,
                              int num_kv_heads) {
  if (prefill_tokens <= 0) return 0;
  return (prefill_tokens / tokens_per_tile + num_requests) * num_kv_heads;
}

// Token tiles run on the wgmma kernel (prefill/kernel.cuh: two warpgroups
// of 64 rows, TMA loads; every KV dtype, fp8 and nvfp4 widened in the kernel)
// when a tile is exactly 128 rows and a warpgroup holds whole tokens (G in 2,
// 4, 8, 16 with few enough top-k entries); otherwise, and when the cache
// driver cannot encode TMA maps, on the mma.sync tile kernel (also when the
// tuning asks for it). cache_ok: the caller's own condition on the cache
// (key-major: bf16 / fp16 only).
inline bool use_wgmma_tiles(bool cache_ok, int group, int tokens_per_tile) {
  return cache_ok && group > 0 && 64 % group == 0 && group * tokens_per_tile == kTileRows;
}

// ---- split token tiles (prefill/kernel.cuh, persistent bf16 / fp16 CTAs) ------
// A step with few tiles leaves SMs idle or ends on a partial round. Splitting
// a tile's union S ways (work item (tile, s) takes entries s, s + S, ...)
// gives S items of about 1 / S tile each, whose rows are 16-bit partials with
// their lse, merged per (token, query head) afterwards (key_major.cu,
// merge_partials). Steps that leave at least half the SMs without a tile
// split every tile as many ways as the grid holds (at most kMaxTileSplits).
// Longer steps whose last round is at most half full split only that round's
// tiles (numbers from `from` on, a multiple of the KV heads), as many ways as
// fill it, so that the step ends about half a round earlier while the full
// rounds run whole tiles (splitting them costs more than it saves); only
// after at most kMaxWholeRounds full rounds, since the half round saved is a
// small share of a longer step while every prefill row still passes the
// merge and the partials span every token (measured: one and two). Measured
// on the H200 (bench/RESULTS.md, clustered, 16/1 bf16): 33 tiles (b=1,
// 256-token chunk) 47.5 -> 27.0 us with every tile split 4 ways; 330 tiles
// (b=10, 256 tokens) 127.4-127.9 -> 117.8-118.3 us (ctx 17K) with the last 66
// split 2 ways, but 124.2 -> 130.6 us with every tile split 2 ways; 193 tiles
// (b=1, 1536 tokens) 81.1-81.2 us with every tile split 2 ways, 73.3-73.5
// with the last 61 split 2 ways.
inline constexpr int kMaxTileSplits = 4;
inline constexpr int kMaxWholeRounds = 2;
struct TileSplit {
  int splits = 1;          // ways each split tile's union is divided
  std::int64_t from = 0;   // tiles below this number run whole
};
inline TileSplit choose_tile_split(std::int64_t tiles, int num_sms, int num_kv_heads) {
  if (tiles <= 0 || num_sms <= 0 || num_kv_heads <= 0) return {};
  if (2 * tiles <= num_sms) return {int(std::min<std::int64_t>(kMaxTileSplits, num_sms / tiles)), 0};
  if (tiles / num_sms > kMaxWholeRounds) return {};
  const std::int64_t from = tiles / num_sms * num_sms / num_kv_heads * num_kv_heads;
  const std::int64_t tail = tiles - from;
  if (tail <= 0 || 2 * tail > num_sms) return {};
  return {int(std::min<std::int64_t>(kMaxTileSplits, num_sms / tail)), from};
}
// The work items of `tiles` token tiles under a split: whole tiles, then S
// items per split tile.
inline std::int64_t tile_split_items(std::int64_t tiles, const TileSplit& t) {
  return t.splits > 1 ? t.from + (tiles - t.from) * t.splits : tiles;
}

// ---- key-major prefill (key_major/kernel.cuh, key_major.cu) ------------------
// A key-major work item is one (KV head, request, block) row of the k2q plan
// (msa::cuda::build_k2q) with up to key_major_item_tokens of the tokens that
// selected the block (kKeyMajorRows query rows, one consumer warpgroup's): the
// item's K / V block serves exactly the rows that need it, so a
// step whose neighbouring tokens select unrelated blocks (where a token tile
// loads a union of ~100 blocks for 8 tokens) runs at token-tile speed per
// block. Each edge (token, slot) gets a normalized partial output and lse,
// merged per token afterwards. The host cannot see the selections, so a step
// that may run key-major builds the plan on the device, and the device picks
// (prefer_key_major) between the two kernels, both launched, the other one's
// CTAs exiting at once.
//
// Steps that may run key-major: prefill only (no decode rows), on the wgmma
// tiles over bf16 / fp16 pages (half_pages: a bf16 / fp16 cache, or an fp8 /
// nvfp4 one without per-token scales whose selected blocks all widen ahead,
// widen/choice.hpp), at most kKeyMajorMaxRequests requests, and
// asked for by the caller's order: key-major (always), or automatic with at
// least min_tokens tokens (AttentionTuning::key_major_min_tokens, by default
// kKeyMajorMinTokens: the k2q plan costs tens of microseconds whichever
// kernel runs, a few percent of a 16K-token chunk's tiles).
// order: PrefillOrder (0 query-major, 1 key-major, 2 automatic).
inline constexpr std::int64_t kKeyMajorMinTokens = 8192;
inline constexpr int kKeyMajorMaxRequests = 1024;
inline constexpr int kKeyMajorRows = 64;
inline constexpr int kKeyMajorStats = 5;  // int64 counts and gates of the choice (key_major.hpp)
inline int key_major_item_tokens(int group) { return kKeyMajorRows / std::max(group, 1); }
// A CTA frees a K / V slot once kKeyMajorRelease arrivals reach its mbarrier
// (the most one counts): four per item that read the block and the rest from
// the streamer, at least one, so a block's items, each at least one token,
// stay below kKeyMajorMaxTokens; steps of more tokens run the token tiles.
inline constexpr std::uint32_t kKeyMajorRelease = (1u << 20) - 1;
inline constexpr std::int64_t kKeyMajorMaxTokens = (kKeyMajorRelease - 1) / 4;
enum class KeyMajorMode { off, always, device_choice };
inline KeyMajorMode key_major_mode(int order, bool half_pages, bool wgmma_tiles, std::int64_t num_tokens,
                                   std::int64_t num_decode_tokens, int num_requests,
                                   std::int64_t min_tokens = kKeyMajorMinTokens) {
  if (!half_pages || !wgmma_tiles || num_decode_tokens != 0 || num_requests > kKeyMajorMaxRequests ||
      num_tokens <= 0 || num_tokens > kKeyMajorMaxTokens)
    return KeyMajorMode::off;
  if (order == 1) return KeyMajorMode::always;
  if (order == 2 && num_tokens >= min_tokens) return KeyMajorMode::device_choice;
  return KeyMajorMode::off;
}
// The device's choice: token tiles run one round per (tile, union block) pair,
// key-major one per work item plus the partials' traffic and merge. On the
// H200 the two orders take the same time at 1.04-1.16 rounds per item of 64
// rows (prefill at 32K contexts, from random through partly shared to
// clustered selections, bf16 and fp8: bench/RESULTS.md); clustered
// selections give about 0.5, random ones about 3. tile_rounds: the (tile,
// block) pairs of the step; items: the key-major work items. always: the
// order is key-major.
inline constexpr double kKeyMajorItemCost = 1.1;
MSA_HD bool prefer_key_major(std::int64_t tile_rounds, std::int64_t items, bool always) {
  return always || (items > 0 && double(tile_rounds) > kKeyMajorItemCost * double(items));
}
// Upper bound of the work items: sum over rows of ceil(edges / T) <= edges / T + rows with edges.
inline std::int64_t key_major_max_items(std::int64_t edges, std::int64_t rows, int tokens_per_tile) {
  return edges / std::max(tokens_per_tile, 1) + std::min(edges, rows) + 1;
}

// Split-K factor of decode rows on nvfp4 caches, whose row kernel spends
// several instructions per pair of codes converting every block before its
// math, so that a block costs more than a bf16 one and the CTA count matters
// more than the merge: the most splits that keep `rows` x splits CTAs within
// one wave (ctas_per_sm per SM), at most kMaxClusterSplits and `topk`, and
// beyond 4 only when the clusters fit at once. Measured on the H200
// (bench/RESULTS.md in git history, 16/1 fp8_e4m3, when the row kernel still
// widened blocks in shared memory): batch 1 17.3 us at 8 splits against 22.1
// at choose_splits' 16, batch 8 18.4 against 22.9, batch 32 25.2 at 4 against
// 29.2 at 3, batch 64 and 128 unchanged (2 and 1). fp8 caches with per-tensor
// scales take choose_splits since their codes become fp16 in one instruction
// per pair (H200, 16/1 fp8_e4m3: batch 64 17.8-18.0 us against
// 19.5-19.8, batch 128 24.0-24.2 against 25.2-25.4; batch 32 15.2-15.4
// against 16.8-17.0 once its clusters count at one CTA per SM, plan.cpp; with
// per-token scales, on bf16 MMA, choose_splits was up to 5% slower, so they
// keep this rule).
inline int choose_converted_splits(std::int64_t rows, int topk, int num_sms, const ClusterCapacity& capacity = {},
                                   int ctas_per_sm = kCtasPerSm) {
  if (rows <= 0 || topk <= 1 || num_sms <= 0) return 1;
  const std::int64_t slots = std::int64_t(num_sms) * std::max(ctas_per_sm, 1);
  int s = int(std::min<std::int64_t>({std::int64_t(std::min(topk, kMaxClusterSplits)), slots / rows}));
  while (s > 4 && !capacity.fits(s, rows)) --s;
  return std::max(s, 1);
}

struct Splits {
  int decode = 1;   // for tokens [0, num_decode_tokens)
  int prefill = 1;  // for tokens [num_decode_tokens, num_tokens)
  int max() const { return std::max(decode, prefill); }
};

// Split factors of a step: decode and prefill rows are judged apart (they run
// in one launch, decode CTAs first, but each class has its own factor).
// converted: the cache is nvfp4, or fp8 with per-token scales
// (choose_converted_splits for decode rows).
inline Splits choose_step_splits(std::int64_t num_tokens, std::int64_t num_decode_tokens,
                                 int num_kv_heads, int topk, int num_sms,
                                 const ClusterCapacity& capacity = {}, bool converted = false,
                                 int ctas_per_sm = kCtasPerSm) {
  Splits s;
  const std::int64_t prefill_tokens = num_tokens - num_decode_tokens;
  const std::int64_t decode_rows = num_decode_tokens * num_kv_heads;
  if (num_decode_tokens > 0)
    s.decode = converted ? choose_converted_splits(decode_rows, topk, num_sms, capacity, ctas_per_sm)
                         : choose_splits(decode_rows, topk, num_sms, capacity);
  if (prefill_tokens > 0) s.prefill = choose_splits(prefill_tokens * num_kv_heads, topk, num_sms, capacity);
  return s;
}

// Pieces of the workspace start at multiples of this (schedule.hpp).
inline constexpr std::size_t kWorkspaceAlign = 256;
inline std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

inline constexpr std::size_t kKeyMajorItemBytes = 32;
inline constexpr std::size_t kDim16Bytes = 128 * 2;  // a 16-bit row of 128 dims

}  // namespace msa::cuda::attention
