// Tile scheduler and block union of the token-tile attention kernel: which
// (request, T consecutive prefill tokens, KV head) a CTA owns, and the sorted
// union of the blocks those tokens selected, each with the mask of the tokens
// that selected it. Everything is read on the device (no host copy of the step).
#pragma once

#include <cstdint>

#include "cuda/attention/heuristics.hpp"
#include "cuda/attention/kernel_entries.cuh"
#include "cuda/attention/kernel_smem.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/device_check.cuh"

namespace msa::cuda::attention {

inline constexpr int kTileThreads = kTileRows / 16 * 32;  // 8 warps, 16 rows each

// The [extra] area of the token-tile layout (byte offsets from L::kExtra).
struct TileMeta {
  static constexpr int kPairMask = 0;                               // uint64 [512] tokens selecting a pair's id
  static constexpr int kEntryMask = kPairMask + kTileMaxPairs * 8;  // uint64 [512] tokens selecting entry e
  static constexpr int kPairId = kEntryMask + kTileMaxPairs * 8;    // int32 [512] usable id of pair or -1
  static constexpr int kPairPage = kPairId + kTileMaxPairs * 4;     // int32 [512] page of a first occurrence
  // int32 [512]: the id of a first occurrence with a good page, else INT32_MAX
  static constexpr int kPairKey = kPairPage + kTileMaxPairs * 4;
  static constexpr int kEntryBlock = kPairKey + kTileMaxPairs * 4;  // int32 [512] union, ascending block ids
  static constexpr int kEntryPage = kEntryBlock + kTileMaxPairs * 4;  // int32 [512] their pages
  static constexpr int kPos = kEntryPage + kTileMaxPairs * 4;       // int32 [64] position of tile token t or -1
  static constexpr int kScalars = kPos + kTileMaxTokens * 4;        // int32 [4]: entries, max position
  static constexpr int kBytes = kScalars + 16;
};

template <KvKind kKind>
using TileLayout = SmemLayout<kKind, 2, kTileRows, TileMeta::kBytes>;

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

// The union of the tile's selected blocks, built by the whole CTA into the
// [extra] area; returns the number of entries (after a __syncthreads). A pair
// (token t, entry k) is usable when its id is valid (>= 0), eligible (<= p_t /
// 128, inside the block table) and its page is inside the cache; repeats in a
// row count once. Ineligible ids and bad pages are recorded in the DeviceCheck.
// Entries come out in ascending block order, each with the mask of the tile's
// tokens that selected it.
// kCtaThreads: the CTA's threads (all of them take part).
//   s_pos: [count] token positions (-1: the token attends nothing), already set
template <int kCtaThreads = kTileThreads>
__device__ __forceinline__ int build_union(const AttendParams& p, const TileWork& t, unsigned char* extra,
                                           int tid) {
  auto* pair_mask = reinterpret_cast<std::uint64_t*>(extra + TileMeta::kPairMask);
  auto* entry_mask = reinterpret_cast<std::uint64_t*>(extra + TileMeta::kEntryMask);
  auto* pair_id = reinterpret_cast<std::int32_t*>(extra + TileMeta::kPairId);
  auto* pair_page = reinterpret_cast<std::int32_t*>(extra + TileMeta::kPairPage);
  auto* pair_key = reinterpret_cast<std::int32_t*>(extra + TileMeta::kPairKey);
  auto* entry_block = reinterpret_cast<std::int32_t*>(extra + TileMeta::kEntryBlock);
  auto* entry_page = reinterpret_cast<std::int32_t*>(extra + TileMeta::kEntryPage);
  const auto* s_pos = reinterpret_cast<const std::int32_t*>(extra + TileMeta::kPos);
  auto* scalars = reinterpret_cast<std::int32_t*>(extra + TileMeta::kScalars);

  const int topk = p.topk_count;
  const int pairs = t.count * topk;  // <= kTileMaxPairs (tile_tokens)
  const bool table_ok = t.request >= 0 && t.request < p.table_rows;
  const std::int32_t* table = p.table + std::int64_t(table_ok ? t.request : 0) * p.table_stride;

  // The raw ids, checked against each token's own eligible range.
  for (int i = tid; i < pairs; i += kCtaThreads) {
    const int tok = i / topk, k = i - tok * topk;
    const int pos = s_pos[tok];
    int id = -1;
    if (pos >= 0 && table_ok) {
      const int token = t.first + tok;
      const int raw = p.topk[std::int64_t(token) * p.topk_token_stride +
                             std::int64_t(t.head) * p.topk_head_stride + k];
      const int last = pos / kBlockKeys;
      if (raw >= 0) {
        if (raw > last || raw >= p.table_cols)
          detail::record_bad(p.check, detail::kBadTopkId, token, t.head, k, raw, t.request, last + 1);
        else
          id = raw;
      }
    }
    pair_id[i] = id;
  }
  __syncthreads();

  // First occurrences: the page and the tokens that selected the id.
  for (int i = tid; i < pairs; i += kCtaThreads) {
    const int id = pair_id[i];
    int key = 0x7fffffff;
    if (id >= 0) {
      bool first = true;
      for (int j = 0; j < i; ++j)
        if (pair_id[j] == id) {
          first = false;
          break;
        }
      if (first) {
        std::uint64_t mask = 0;
        for (int tok = i / topk; tok < t.count; ++tok)
          for (int k = 0; k < topk; ++k)
            if (pair_id[tok * topk + k] == id) {
              mask |= std::uint64_t(1) << tok;
              break;
            }
        const int page = table[id];
        if (page >= 0 && page < p.num_pages) {
          key = id;
          pair_page[i] = page;
          pair_mask[i] = mask;
        } else {
          detail::record_bad(p.check, detail::kBadBlockTable, t.request, id, 0, page, p.num_pages);
        }
      }
    }
    pair_key[i] = key;
  }
  if (tid == 0) scalars[0] = 0;
  __syncthreads();

  // Rank of each good first occurrence among them: its place in the union.
  for (int i = tid; i < pairs; i += kCtaThreads) {
    const int id = pair_key[i];
    if (id == 0x7fffffff) continue;
    int rank = 0;
    for (int j = 0; j < pairs; ++j) rank += pair_key[j] < id;
    entry_block[rank] = id;
    entry_page[rank] = pair_page[i];
    entry_mask[rank] = pair_mask[i];
    atomicAdd(scalars, 1);
  }
  __syncthreads();
  return scalars[0];
}

}  // namespace msa::cuda::attention
