// Tile scheduler and block union of the token-tile attention kernel: which
// (request, T consecutive prefill tokens, KV head) a CTA owns, and the sorted
// union of the blocks those tokens selected, each with the mask of the tokens
// that selected it. Everything is read on the device (no host copy of the step).
#pragma once

#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/shared/step.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/device_check.cuh"

namespace msa::cuda::attention {

inline constexpr int kTileThreads = kTileRows / 16 * 32;  // 8 warps, 16 rows each

// The [extra] area of the token-tile layout (byte offsets from L::kExtra): the
// scratch of the union builder, then the tile's list (what the attention
// reads). The union is built through a hash set of the tile's ids (open
// addressing, kTileHashSlots slots, at most kTileMaxPairs keys).
inline constexpr int kTileHashSlots = 2 * kTileMaxPairs;
static_assert(kTileHashSlots == 1024, "build_union hashes ids to 10 bits");
struct UnionScratch {
  static constexpr int kHashMask = 0;                              // uint64 [1024] tokens selecting the slot's id
  static constexpr int kHashKey = kHashMask + kTileHashSlots * 8;  // int32 [1024] id in the slot or -1
  static constexpr int kPairId = kHashKey + kTileHashSlots * 4;    // int32 [512] usable id of pair or -1
  static constexpr int kDistinct = kPairId + kTileMaxPairs * 4;    // int32 [512] slots in use (any order)
  static constexpr int kGoodId = kDistinct + kTileMaxPairs * 4;    // int32 [512] their ids, INT32_MAX if bad page
  static constexpr int kGoodPage = kGoodId + kTileMaxPairs * 4;    // int32 [512] their pages
  static constexpr int kHashPage = kGoodPage + kTileMaxPairs * 4;   // int32 [1024] page of the slot's id
  static constexpr int kLeadMask = kHashPage + kTileHashSlots * 4;  // uint64: tokens selecting the lead block
  static constexpr int kBytes = kLeadMask + 8;
};
struct TileList {
  static constexpr int kEntryMask = 0;                                // uint64 [512] tokens selecting entry e
  static constexpr int kEntryBlock = kEntryMask + kTileMaxPairs * 8;  // int32 [512] union, ascending block ids
  static constexpr int kEntryPage = kEntryBlock + kTileMaxPairs * 4;  // int32 [512] their pages
  static constexpr int kPos = kEntryPage + kTileMaxPairs * 4;         // int32 [64] position of tile token t or -1
  static constexpr int kScalars = kPos + kTileMaxTokens * 4;         // int32 [4]: entries, distinct ids, lead block, its page
  static constexpr int kBytes = kScalars + 16;
  static constexpr int kLeadBlock = 2, kLeadPage = 3;  // indices into kScalars: the lead block (-1: none), its page
};
// The lead block of a listed union (build_union_with): its entry 0, or -1.
//   list: TileList
__device__ __forceinline__ int lead_block(const unsigned char* list) {
  return reinterpret_cast<const int*>(list + TileList::kScalars)[TileList::kLeadBlock];
}
struct TileMeta {
  static constexpr int kScratch = 0;
  static constexpr int kList = UnionScratch::kBytes;
  static constexpr int kEntryMask = kList + TileList::kEntryMask;
  static constexpr int kEntryBlock = kList + TileList::kEntryBlock;
  static constexpr int kEntryPage = kList + TileList::kEntryPage;
  static constexpr int kPos = kList + TileList::kPos;
  static constexpr int kBytes = kList + TileList::kBytes;
};

// The tile list of the [extra] area, as the attention reads it.
struct TileEntries {
  std::int32_t* pos;            // [count] position of tile token t, or -1
  const std::int32_t* block;    // [entries] the union, ascending block ids
  const std::int32_t* page;     // [entries] their pages
  const std::uint64_t* mask;    // [entries] the tile's tokens that selected each
};
//   list: a TileList
__device__ __forceinline__ TileEntries list_entries(unsigned char* list) {
  return {reinterpret_cast<std::int32_t*>(list + TileList::kPos),
          reinterpret_cast<const std::int32_t*>(list + TileList::kEntryBlock),
          reinterpret_cast<const std::int32_t*>(list + TileList::kEntryPage),
          reinterpret_cast<const std::uint64_t*>(list + TileList::kEntryMask)};
}
__device__ __forceinline__ TileEntries tile_entries(unsigned char* extra) { return list_entries(extra + TileMeta::kList); }

struct TileWork {
  int head = 0;      // KV head
  int request = -1;  // -1: the CTA has no tile
  int first = 0;     // first token of the tile
  int count = 0;     // tokens in the tile, <= tile_tokens
  int seq = 0, q0 = 0, q1 = 0;  // seq_lens[request], query_start[request], query_start[request + 1]
};

// Number of the first tile of request r (heuristics.hpp).
__device__ __forceinline__ std::int64_t first_tile_of(const AttendParams& p, int r) {
  return first_tile_number(p.query_start[r], p.num_decode_tokens, p.tile_tokens, r);
}

// CTAs are numbered tile-major, KV head fastest. The request of tile c is the
// last r with first_tile_of(r) <= c, found by warp-wide searches (each round
// narrows the range 32-fold: one round trip up to 32 requests, two up to 1024).
// Called by every warp (the loads hit the same lines); inconsistent step data
// give an empty or clamped tile, never an access outside the arrays.
__device__ __forceinline__ TileWork tile_of_cta(const AttendParams& p, std::int64_t cta, int lane) {
  TileWork t;
  t.head = int(cta % p.num_kv_heads);
  const std::int64_t c = cta / p.num_kv_heads;
  int lo = 0, hi = p.num_requests - 1;
  while (lo <= hi) {
    const int len = hi - lo + 1;
    const int step = len <= 32 ? 1 : (len + 31) / 32;
    const int r = lo + lane * step;
    const bool fits = r <= hi && first_tile_of(p, r) <= c;
    const unsigned ballot = __ballot_sync(0xffffffffu, fits);
    if (ballot == 0) return t;  // before the first tile
    const int at = 31 - __clz(int(ballot));
    if (step == 1) {
      lo = lo + at;
      break;
    }
    const int new_lo = lo + at * step;
    hi = min(hi, new_lo + step - 1);
    lo = new_lo;
  }
  const int r = lo;
  if (r < 0 || r >= p.num_requests) return t;
  t.seq = p.seq_lens[r];
  t.q0 = p.query_start[r];
  t.q1 = p.query_start[r + 1];
  const int start = t.q0 > p.num_decode_tokens ? t.q0 : p.num_decode_tokens;  // first prefill token
  const std::int64_t j = c - first_tile_of(p, r);
  const std::int64_t first = start + j * p.tile_tokens;
  if (j < 0 || first >= t.q1 || first >= p.num_tokens) return t;
  const std::int64_t end = t.q1 < p.num_tokens ? t.q1 : p.num_tokens;
  t.request = r;
  t.first = int(first);
  t.count = int(end - first < p.tile_tokens ? end - first : p.tile_tokens);
  return t;
}

// Work item `item` of a token-tile launch (AttendParams::tile_split_from):
// its tile number and its share `split` of `splits` (1: the whole tile).
struct TileItem {
  std::int64_t tile = 0;
  int split = 0, splits = 1;
};
__device__ __forceinline__ TileItem tile_item(const AttendParams& p, std::int64_t item) {
  if (p.tile_splits <= 1 || item < p.tile_split_from) return {item, 0, 1};
  const std::int64_t k = item - p.tile_split_from;
  return {p.tile_split_from + k / p.tile_splits, int(k % p.tile_splits), p.tile_splits};
}

// The union of the tile's selected blocks, built by kWorkers threads into the
// tile list; returns the number of entries (after a sync). A pair
// (token t, entry k) is usable when its id is valid (>= 0), eligible (<= p_t /
// 128, inside the block table) and its page is inside the cache; repeats in a
// row count once. Ineligible ids and bad pages are recorded in the DeviceCheck.
// Entries come out in ascending block order, each with the mask of the tile's
// tokens that selected it. Every step is one parallel pass with no search
// loop that stops early: the ids go into a shared hash set (the token masks
// OR-ed into their slots, the page of each id, loaded with the ids, into its
// slot), the distinct ids are listed with their pages, and each good one is
// placed by its rank among them.
// kWorkers threads take part (tid in [0, kWorkers)), `sync` joins them all.
// splits > 1 (split tiles): only the entries of rank split, split + splits,
// ... are kept, in order.
// `after_ids(scalars)` runs on every worker once its ids' loads are issued and
// before their values are used (the first tile's lead block is named there). It
// may name a lead block: one worker writes scalars[TileList::kLeadBlock] (the
// block, or -1) and scalars[TileList::kLeadPage] (its page, checked by that
// worker) before the first sync; when
// the block is not -1 it is entry 0 (the tokens that selected it in its mask,
// possibly none) and the other entries follow in ascending order. Only with
// splits == 1.
//   scratch: UnionScratch; list: TileList whose positions [count] are already
//   set (-1: the token attends nothing)
template <int kWorkers, class Sync, class AfterIds>
__device__ __forceinline__ int build_union_with(const AttendParams& p, const TileWork& t, unsigned char* scratch,
                                                unsigned char* list, int tid, Sync sync, AfterIds after_ids,
                                                int split = 0, int splits = 1) {
  auto* hash_mask = reinterpret_cast<unsigned long long*>(scratch + UnionScratch::kHashMask);
  auto* hash_key = reinterpret_cast<int*>(scratch + UnionScratch::kHashKey);
  auto* pair_id = reinterpret_cast<std::int32_t*>(scratch + UnionScratch::kPairId);
  auto* hash_page = reinterpret_cast<std::int32_t*>(scratch + UnionScratch::kHashPage);
  auto* distinct = reinterpret_cast<std::int32_t*>(scratch + UnionScratch::kDistinct);
  auto* good_id = reinterpret_cast<std::int32_t*>(scratch + UnionScratch::kGoodId);
  auto* good_page = reinterpret_cast<std::int32_t*>(scratch + UnionScratch::kGoodPage);
  auto* entry_mask = reinterpret_cast<std::uint64_t*>(list + TileList::kEntryMask);
  auto* entry_block = reinterpret_cast<std::int32_t*>(list + TileList::kEntryBlock);
  auto* entry_page = reinterpret_cast<std::int32_t*>(list + TileList::kEntryPage);
  const auto* s_pos = reinterpret_cast<const std::int32_t*>(list + TileList::kPos);
  auto* scalars = reinterpret_cast<int*>(list + TileList::kScalars);
  auto* lead_mask = reinterpret_cast<unsigned long long*>(scratch + UnionScratch::kLeadMask);

  const int topk = p.topk.topk;
  const int pairs = t.count * topk;  // <= kTileMaxPairs (tile_tokens)
  const bool table_ok = t.request >= 0 && t.request < p.table.num_rows;
  const std::int32_t* table = p.table.row(table_ok ? t.request : 0);

  // The raw ids, checked against each token's own eligible range; an empty set.
  for (int h = tid; h < kTileHashSlots; h += kWorkers) {
    hash_key[h] = -1;
    hash_mask[h] = 0;
  }
  if (tid == 0) {
    scalars[0] = scalars[1] = 0;
    *lead_mask = 0;
  }
  // Each thread's pairs are i = tid + j * kWorkers. With at most two per
  // thread (a whole CTA planning) their pages are loaded here and used only
  // once the set is built, so that the block-table round trip overlaps the
  // hashing; fewer workers (the planners of later tiles, off the critical
  // path, with fewer registers) look the pages up per distinct id after it.
  constexpr int kPerThread = (kTileMaxPairs + kWorkers - 1) / kWorkers;
  constexpr bool kEarlyPages = kPerThread <= 2;
  int page_of[kPerThread], raw_of[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = tid + j * kWorkers;
    raw_of[j] = -1;
    if (i >= pairs) continue;
    const int tok = i / topk, k = i - tok * topk;
    if (s_pos[tok] >= 0 && table_ok)
      raw_of[j] = p.topk.row(t.first + tok, t.head)[k];
  }
  after_ids(scalars);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = tid + j * kWorkers;
    page_of[j] = -1;
    if (i >= pairs) continue;
    const int tok = i / topk, k = i - tok * topk;
    const int pos = s_pos[tok];
    int id = -1;
    if (pos >= 0 && table_ok) {
      const int token = t.first + tok;
      const int raw = raw_of[j];
      const int last = pos / kBlockKeys;
      if (raw >= 0) {
        if (raw > last || raw >= p.table.max_blocks)
          detail::record_bad(p.check, detail::kBadTopkId, token, t.head, k, raw, t.request, last + 1);
        else
          id = raw;
      }
    }
    pair_id[i] = id;
    if (kEarlyPages && id >= 0) page_of[j] = table[id];
  }
  sync();

  // Into the set: linear probing from a multiplicative hash (at most half
  // full); the thread that claims a slot writes its id's page. The lead
  // block's selections go to its own mask.
  const int lead = scalars[TileList::kLeadBlock];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = tid + j * kWorkers;
    if (i >= pairs) continue;
    const int id = pair_id[i];
    if (id < 0) continue;
    if (id == lead) {
      atomicOr(lead_mask, 1ull << (i / topk));
      continue;
    }
    unsigned h = (unsigned(id) * 2654435761u) >> 22;  // 10 bits: kTileHashSlots = 1024
    for (;;) {
      const int old = atomicCAS(&hash_key[h], -1, id);
      if (kEarlyPages && old == -1) hash_page[h] = page_of[j];
      if (old == -1 || old == id) break;
      h = (h + 1) & (kTileHashSlots - 1);
    }
    atomicOr(&hash_mask[h], 1ull << (i / topk));
  }
  sync();

  // The distinct ids (slot order), each with its page; bad pages drop out.
  // The lead block (its page good) is entry 0.
  if (tid == 0 && lead >= 0) {
    entry_block[0] = lead;
    entry_page[0] = scalars[TileList::kLeadPage];
    entry_mask[0] = *lead_mask;
    scalars[0] = 1;
  }
  for (int h = tid; h < kTileHashSlots; h += kWorkers) {
    const int id = hash_key[h];
    if (id < 0) continue;
    const int u = atomicAdd(&scalars[1], 1);
    distinct[u] = h;
    const int page = kEarlyPages ? hash_page[h] : table[id];
    good_page[u] = page;
    if (page >= 0 && page < p.cache.num_pages) {
      good_id[u] = id;
    } else {
      good_id[u] = 0x7fffffff;
      detail::record_bad(p.check, detail::kBadBlockTable, t.request, id, 0, page, p.cache.num_pages);
    }
  }
  sync();

  // Each good id goes to its rank among the good ids: ascending block order.
  const int n_distinct = scalars[1];
  for (int u = tid; u < n_distinct; u += kWorkers) {
    const int id = good_id[u];
    if (id == 0x7fffffff) continue;
    int rank = lead >= 0 ? 1 : 0;
    for (int v = 0; v < n_distinct; ++v) rank += good_id[v] < id;
    if (rank % splits != split) continue;
    rank /= splits;
    const int h = distinct[u];
    entry_block[rank] = id;
    entry_page[rank] = good_page[u];
    entry_mask[rank] = hash_mask[h];
    atomicAdd(&scalars[0], 1);
  }
  sync();
  return scalars[0];
}

// build_union_with over the whole CTA (kCtaThreads threads) and the [extra] area.
template <int kCtaThreads = kTileThreads>
__device__ __forceinline__ int build_union(const AttendParams& p, const TileWork& t, unsigned char* extra,
                                           int tid) {
  return build_union_with<kCtaThreads>(p, t, extra + TileMeta::kScratch, extra + TileMeta::kList, tid,
                                       [] { __syncthreads(); }, [tid](int* scalars) {
                                         if (tid == 0) scalars[TileList::kLeadBlock] = -1;  // no lead block
                                       });
}

}  // namespace msa::cuda::attention
