// Planning one tile of the wgmma token-tile kernel: the tile lookup, token
// positions, the union list (kernel_tile_entries.cuh) and the tile's query
// rows in the swizzled layout wgmma reads, into one of the two plan buffers.
#pragma once

#include <cstdint>

#include "cuda/attention/kernel.cuh"
#include "cuda/attention/kernel_tile_entries.cuh"
#include "cuda/attention/kernel_tile_query.cuh"
#include "cuda/attention/kernel_wgmma_layout.cuh"
#include "cuda/attention/wgmma.cuh"

namespace msa::cuda::attention {

// The tile's query rows (converted to the MMA type) into the two warpgroups'
// swizzled Q tiles; rows of tokens past the tile are zero. kWorkers threads
// (w in [0, kWorkers)) share the chunks.
template <bool kF16, int kWorkers>
__device__ __forceinline__ void stage_wgmma_query(const AttendParams& p, const TileWork& t, unsigned char* q,
                                                  int w) {
  constexpr int kChunks = kTileRows * 16;  // 16-byte chunks of 8 elements
#pragma unroll 2
  for (int idx = w; idx < kChunks; idx += kWorkers) {
    const int row = idx >> 4, c = idx & 15;
    const uint4 v = tile_query_chunk<kF16>(p, t, row, c);
    const int wg = row >> 6, r = row & 63;
    const int at = wg * WgmmaTile::kQBytes + (c >> 3) * WgmmaTile::kQAtomBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(q + at) = v;
  }
}

// Plans tile number `tile` (tile_of_cta) into plan buffer b: its header, token
// positions and union list, and its query rows (converted to the MMA type)
// in Q buffer b, where the union's scratch lives until the rows overwrite it.
// kWorkers threads (w in [0, kWorkers), whole warps) run it, `sync` joins
// them; the caller publishes the plan.
template <bool kF16, int kWorkers, class Sync>
__device__ __forceinline__ void plan_tile(const AttendParams& p, std::int64_t tile, unsigned char* smem, int b,
                                          int w, int lane, Sync sync) {
  using W = WgmmaTile;
  static_assert(kWorkers >= kTileMaxTokens, "a worker per tile token");
  const TileWork t = tile_of_cta(p, tile, lane);
  unsigned char* plan = smem + W::kPlans + b * W::kPlanBytes;
  unsigned char* list = plan + W::kHeaderBytes;
  unsigned char* q = smem + W::kQ + b * W::kQBuf;
  auto* header = reinterpret_cast<std::int32_t*>(plan);
  auto* pos = reinterpret_cast<std::int32_t*>(list + TileList::kPos);
  if (w < t.count) pos[w] = token_position(t.first + w, t.seq, t.q0, t.q1);
  sync();
  const int n = t.request >= 0 ? build_union_with<kWorkers>(p, t, q, list, w, sync) : 0;
  if (w == 0) {
    int max_pos = -1;
    for (int tok = 0; tok < t.count; ++tok) max_pos = max(max_pos, pos[tok]);
    const int tail_block = max_pos >= 0 ? max_pos / kBlockKeys : -1;
    header[PlanHeader::kRequest] = t.request;
    header[PlanHeader::kFirst] = t.first;
    header[PlanHeader::kCount] = t.count;
    header[PlanHeader::kHead] = t.head;
    header[PlanHeader::kEntries] = n;
    header[PlanHeader::kTailBlock] = tail_block;
    header[PlanHeader::kTailKeys] = max_pos - tail_block * kBlockKeys + 1;
  }
  // The rows, over the union's scratch (every planner is past it: the builder ends with a sync).
  if (t.count > 0) stage_wgmma_query<kF16, kWorkers>(p, t, q, w);
  sm90::fence_proxy_async();  // the Q tiles are read by wgmma (async proxy)
  sync();
}

}  // namespace msa::cuda::attention
