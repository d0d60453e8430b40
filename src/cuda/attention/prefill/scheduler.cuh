// Planning one tile of the wgmma token-tile kernel: the tile lookup, token
// positions, the union list (shared/tile_scheduler.cuh) and the tile's query
// rows in the swizzled layout wgmma reads, into one of the two plan buffers.
#pragma once

#include <cstdint>

#include "cuda/attention/shared/query.cuh"
#include "cuda/attention/shared/step.cuh"
#include "cuda/attention/shared/tile_scheduler.cuh"
#include "cuda/attention/prefill/layout.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// The kRows query rows of a tile into Q buffer q (the warpgroups' swizzled
// tiles, 64 rows each): row = tok * G + g is query head head * G + g of token
// token_of(tok) for tok < count, zero past count. kWorkers threads (w in [0,
// kWorkers)) share the 16-byte chunks: copied by cp.async when the query
// already is the MMA type (every chunk in flight at once), else converted
// through registers.
template <bool kF16, int kWorkers, int kRows = kTileRows, class TokenOf>
__device__ __forceinline__ void stage_q_rows(const AttendParams& p, unsigned char* q, int count, int head,
                                             TokenOf token_of, int w) {
  constexpr int kChunks = kRows * 16;  // 16-byte chunks of 8 elements
  auto source = [&](int row, int c) {      // element offset of the chunk in p.q, -1 past count
    const int tok = row / p.group, g = row - tok * p.group;
    if (tok >= count) return std::int64_t(-1);
    const std::int64_t qh = std::int64_t(head) * p.group + g;
    return (std::int64_t(token_of(tok)) * p.num_q_heads + qh) * kDim + 8 * c;
  };
  if (p.q_kind == (kF16 ? kQueryFp16 : kQueryBf16)) {
    const std::uint32_t base = smem_u32(q);
#pragma unroll 1
    for (int idx = w; idx < kChunks; idx += kWorkers) {  // (cp.async does not wait: no unrolling needed)
      const int row = idx >> 4, c = idx & 15;
      const std::int64_t at = source(row, c);
      const auto* src = static_cast<const std::uint16_t*>(p.q) + (at >= 0 ? at : 0);
      cp_async16_zfill(base + std::uint32_t(wgmma_q_offset(row, c)), src, at >= 0 ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    return;
  }
#pragma unroll 2
  for (int idx = w; idx < kChunks; idx += kWorkers) {
    const int row = idx >> 4, c = idx & 15;
    const std::int64_t at = source(row, c);
    const uint4 v = at >= 0 ? load_query_chunk<kF16>(p, at) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(q + wgmma_q_offset(row, c)) = v;
  }
}

// A tile's query rows by TMA (make_query_map's map, rows token-major): one
// box of 64 dims x G heads x 64 / G tokens per warpgroup and half of the dims,
// each landing as that half of the warpgroup's 64 rows in the layout of
// wgmma_q_offset; the barrier completes on their 32 KiB. Rows past the tile's
// tokens hold the next tokens' rows, or zeros past the step's: they attend
// nothing (their scores are masked) and are never written out.
//   q: a Q buffer (1 KiB aligned)
__device__ __forceinline__ void load_q_rows(const CUtensorMap& map, unsigned char* q, std::uint32_t bar, int first,
                                            int head, int group) {
  using W = WgmmaTile;
  sm90::mbar_arrive_expect_tx(bar, W::kQBuf);
  const int tokens = 64 / group;  // per warpgroup
#pragma unroll
  for (int wg = 0; wg < W::kConsumers; ++wg)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      sm90::tma_load_3d(smem_u32(q + wg * W::kQBytes + half * W::kQAtomBytes), &map, bar, 64 * half, head * group,
                        first + wg * tokens);
}

// Writes a plan header.
__device__ __forceinline__ void write_plan_header(std::int32_t* header, int request, int first, int count,
                                                  int head, int entries, int max_pos) {
  const int tail_block = max_pos >= 0 ? max_pos / kBlockKeys : -1;
  header[PlanHeader::kRequest] = request;
  header[PlanHeader::kFirst] = first;
  header[PlanHeader::kCount] = count;
  header[PlanHeader::kHead] = head;
  header[PlanHeader::kEntries] = entries;
  header[PlanHeader::kTailBlock] = tail_block;
  header[PlanHeader::kTailKeys] = max_pos - tail_block * kBlockKeys + 1;
}

// Plans item number `item` into plan buffer b: a tile (tile_of_cta) or, when
// it splits, its share of the union (tile_item). Writes the header, token
// positions and union list, and the tile's query rows (converted to the MMA
// type) in Q buffer b. kWorkers threads (w in [0, kWorkers), whole warps) run
// it, `sync` joins them; the caller publishes the plan. `after_union(n, head,
// list)` runs on every worker once the union is listed, before the rows are
// staged (the first tile's first K loads start there, so that they do not
// wait for the rows).
// The planners of later tiles build the union in Q buffer b, where the rows
// then overwrite its scratch. The whole CTA planning its first tile (kWorkers
// = WgmmaTile::kThreads) builds it in the other Q buffer, so that the rows
// can land while it is built: when the query is the MMA type (the host then
// always passes its map, make_query_map), worker kLeadWorker issues their TMA
// loads as soon as the tile is known (`rows_load(q, first, head)`: load_q_rows
// on the kernel's q_rows barrier, phase 0). That worker also
// names the tile's last block, the block of its last position, as
// the lead block (entry 0 of the union) when its page is good and the item is
// a whole tile: `lead_load(page, head)` starts its K load and says whether it
// did (false: no lead block), before the union is built.
inline constexpr int kLeadWorker = WgmmaTile::kProducerWarp * 32;
template <bool kF16, int kWorkers, class Sync, class AfterUnion, class LeadLoad, class RowsLoad>
__device__ __forceinline__ void plan_tile(const AttendParams& p, std::int64_t item, unsigned char* smem, int b,
                                          int w, int lane, Sync sync, AfterUnion after_union, LeadLoad lead_load,
                                          RowsLoad rows_load) {
  using W = WgmmaTile;
  static_assert(kWorkers >= kTileMaxTokens, "a worker per tile token");
  constexpr bool kFirst = kWorkers == W::kThreads;
  static_assert(!kFirst || kLeadWorker < kWorkers, "the lead worker plans");
  const TileItem it = tile_item(p, item);
  const int split = it.split, splits = it.splits;
  const TileWork t = tile_of_cta(p, it.tile, lane);
  unsigned char* plan = smem + W::kPlans + b * W::kPlanBytes;
  unsigned char* list = plan + W::kHeaderBytes;
  unsigned char* q = smem + W::kQ + b * W::kQBuf;
  unsigned char* scratch = kFirst ? smem + W::kQ + (1 - b) * W::kQBuf : q;
  auto* header = reinterpret_cast<std::int32_t*>(plan);
  auto* pos = reinterpret_cast<std::int32_t*>(list + TileList::kPos);
  const bool tma_rows = kFirst && t.count > 0 && p.q_kind == (kF16 ? kQueryFp16 : kQueryBf16);
  if (tma_rows && w == kLeadWorker) rows_load(q, t.first, t.head);
  if (w < t.count) pos[w] = token_position(t.first + w, t.seq, t.q0, t.q1);
  sync();
  auto token_of = [&](int tok) { return t.first + tok; };
  auto max_position = [&] {
    int max_pos = -1;
    for (int tok = 0; tok < t.count; ++tok) max_pos = max(max_pos, pos[tok]);
    return max_pos;
  };
  auto after_ids = [&](int* scalars) {
    if (kFirst && w == kLeadWorker) {
      // The lead block: the block of the tile's last position, if its page is good.
      const int max_pos = max_position();
      const int block = max_pos >= 0 ? max_pos / kBlockKeys : -1;
      int lead = -1, page = -1;
      if (splits == 1 && block >= 0 && block < p.table.max_blocks && t.request >= 0 && t.request < p.table.num_rows) {
        page = p.table.at(t.request, block);
        if (page >= 0 && page < p.cache.num_pages && lead_load(page, t.head)) lead = block;
      }
      scalars[TileList::kLeadBlock] = lead;
      scalars[TileList::kLeadPage] = page;
    } else if (!kFirst && w == 0) {
      scalars[TileList::kLeadBlock] = -1;
    }
  };
  const int n = t.request >= 0 ? build_union_with<kWorkers>(p, t, scratch, list, w, sync, after_ids, split, splits)
                               : 0;
  if (w == 0) {
    write_plan_header(header, t.request, t.first, t.count, t.head, n, max_position());
    header[PlanHeader::kSplit] = split;
  }
  after_union(n, t.head, list);
  // The rows: the first tile's TMA loads are in flight already; otherwise
  // they go over the union's scratch (every planner is past it: the builder
  // ends with a sync).
  if (tma_rows)
    sm90::mbar_wait(WgmmaBars{smem_u32(smem + W::kBars)}.q_rows(), 0);
  else if (t.count > 0)
    stage_q_rows<kF16, kWorkers>(p, q, t.count, t.head, token_of, w);
  sm90::fence_proxy_async();  // the Q tiles are read by wgmma (async proxy)
  sync();
}

}  // namespace msa::cuda::attention
