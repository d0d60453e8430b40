// The producer side of the wgmma token-tile kernel: K / V tiles of a tile's
// union blocks into the two-slot rings, by TMA straight into the slots
// (bf16 / fp16, one warp, here) or as raw fp8 / nvfp4 codes widened in place
// by the whole producer warpgroup (widen_blocks, here; each format's raw loads
// and row widening in produce_fp8.cuh, produce_fp4.cuh); the tail block's
// unwritten V rows are zeroed.
#pragma once

#include <cstdint>

#include "cuda/common/fp4_fragments.hpp"
#include "cuda/attention/format.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/attention/prefill/layout.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// Zeroes the rows >= `keys` of a V tile (both 64-dim halves; a whole row is
// zero whatever its swizzle), then the proxy fence (wgmma reads the tile).
__device__ __forceinline__ void zero_v_rows(unsigned char* tile, int keys, int lane) {
  const int chunks = (kBlockKeys - keys) * 16;
  for (int idx = lane; idx < chunks; idx += 32) {
    const int r = keys + (idx >> 4), c = idx & 15;
    *reinterpret_cast<uint4*>(tile + (c >> 3) * WgmmaTile::kAtomBytes + r * 128 + ((c & 7) << 4)) =
        make_uint4(0, 0, 0, 0);
  }
  sm90::fence_proxy_async();
}

// The K tile of the CTA's g-th streamed block (on `page`) into its slot by
// TMA, once the slot is free (one thread). kScaled (blocks widened with
// per-token scales, widen/choice.hpp): the block's K and V scales, float
// [2][128] at scales + (page x heads + head) x 256, come on the same barrier
// into the slot's scale array.
template <bool kScaled = false>
__device__ __forceinline__ void load_k_tile(const KvMaps& maps, int page, int head, unsigned char* smem,
                                            const WgmmaBars& bar, int g, const float* scales = nullptr,
                                            int heads = 0) {
  using W = WgmmaTile;
  const int s = ring_slot(g);
  const int c1 = map_coord(maps, 1, head, page), c2 = map_coord(maps, 2, head, page),
            c3 = map_coord(maps, 3, head, page);
  const std::uint32_t k_dst = smem_u32(smem + W::kK + s * W::kPlaneBytes);
  if (g >= W::kSlots) sm90::mbar_wait(bar.empty_k(s), ring_parity(g) ^ 1u);  // the slot's previous use
  sm90::mbar_arrive_expect_tx(bar.full_k(s), W::kPlaneBytes + (kScaled ? W::kSlotScaleBytes : 0));
  sm90::tma_load_4d(k_dst, &maps.k, bar.full_k(s), 0, c1, c2, c3);
  sm90::tma_load_4d(k_dst + W::kAtomBytes, &maps.k, bar.full_k(s), 64, c1, c2, c3);
  if constexpr (kScaled)
    sm90::bulk_load(smem_u32(smem + W::kScales + s * W::kSlotScaleBytes),
                    scales + (std::int64_t(page) * heads + head) * 2 * kBlockKeys, W::kSlotScaleBytes, bar.full_k(s));
}

// bf16 / fp16 producer (one warp), one tile: K and V of every union block by
// TMA straight into the slots (the K tiles of the first k_issued blocks went
// already); g0 blocks went before it. Block g waits for block g - 2's slot.
// The tail block's V goes through its own barrier (`tails` uses of it
// before) so that the warp can zero its unwritten rows before publishing it.
// kScaled: the blocks' scales come with their K tiles (load_k_tile).
template <bool kScaled = false>
__device__ __forceinline__ void load_half_blocks(const KvMaps& maps, const TileEntries& entries, int n, int head,
                                                 int tail_block, int tail_keys, unsigned char* smem,
                                                 const WgmmaBars& bar, int lane, int g0, int& tails,
                                                 int k_issued, const float* scales = nullptr, int heads = 0) {
  using W = WgmmaTile;
  for (int i = 0; i < n; ++i) {
    const int g = g0 + i, s = ring_slot(g);
    const std::uint32_t parity = ring_parity(g) ^ 1u;  // the slot's previous use
    const int page = entries.page[i];
    const int c1 = map_coord(maps, 1, head, page), c2 = map_coord(maps, 2, head, page),
              c3 = map_coord(maps, 3, head, page);
    const std::uint32_t v_dst = smem_u32(smem + W::kV + s * W::kPlaneBytes);
    if (lane == 0) {
      if (i >= k_issued) load_k_tile<kScaled>(maps, page, head, smem, bar, g, scales, heads);
      if (g >= W::kSlots) sm90::mbar_wait(bar.empty_v(s), parity);
    }
    __syncwarp();
    if (entries.block[i] == tail_block && tail_keys < kBlockKeys) {
      if (lane == 0) {
        sm90::mbar_arrive_expect_tx(bar.tail(), W::kPlaneBytes);
        sm90::tma_load_4d(v_dst, &maps.v, bar.tail(), 0, c1, c2, c3);
        sm90::tma_load_4d(v_dst + W::kAtomBytes, &maps.v, bar.tail(), 64, c1, c2, c3);
      }
      sm90::mbar_wait(bar.tail(), std::uint32_t(tails & 1));
      ++tails;
      zero_v_rows(smem + W::kV + s * W::kPlaneBytes, tail_keys, lane);
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(bar.full_v(s));
    } else if (lane == 0) {
      sm90::mbar_arrive_expect_tx(bar.full_v(s), W::kPlaneBytes);
      sm90::tma_load_4d(v_dst, &maps.v, bar.full_v(s), 0, c1, c2, c3);
      sm90::tma_load_4d(v_dst + W::kAtomBytes, &maps.v, bar.full_v(s), 64, c1, c2, c3);
    }
  }
}

// The token tiles' producer of a tile's blocks for caches read as stored
// (Format<kKind>::TileProducer, format.cuh): load_half_blocks, by the
// streaming warp (lane); k_issued: K tiles its lead load already issued.
struct HalfTileProducer {
  template <KvKind kKind, bool kF16, bool kScaled>
  __device__ __forceinline__ static void stream(const AttendParams& p, const KvMaps& maps, const TileEntries& entries,
                                                int n, int head, int tail_block, int tail_keys, unsigned char* smem,
                                                const WgmmaBars& bar, int lane, int ptid, int g0, int& tails,
                                                int k_issued) {
    (void)ptid;
    load_half_blocks<kScaled>(maps, entries, n, head, tail_block, tail_keys, smem, bar, lane, g0, tails, k_issued,
                              p.cache.k_scales, p.num_kv_heads);
  }
};

// The converting producer (the whole warpgroup, ptid 0..127), one tile after
// g0 blocks: its thread 0 starts the raw K and V loads of each block
// (load_raw(plane, i, slot, raw barrier), plane 0 = K) once the slot is free:
// K(i + 1) as soon as its slot is, V(i + 1) once V(i) is published, so that no
// wait closes a cycle with the consumers. Every thread widens one K row and
// one V row per block (widen(plane, i, plane tile, row, zero); the tail
// block's V rows past the last position read as zero), and K and V are
// published apart: by thread 0 after the warpgroup's barrier, or by every
// thread (every_thread, WgmmaTile::full_arrivals).
template <class LoadRaw, class Widen>
__device__ __forceinline__ void widen_blocks(const TileEntries& entries, int n, int tail_block, int tail_keys,
                                             unsigned char* smem, const WgmmaBars& bar, int ptid, int g0,
                                             bool every_thread, LoadRaw load_raw, Widen widen) {
  using W = WgmmaTile;
  auto issue = [&](int plane, int i) {  // thread 0 only
    const int g = g0 + i, s = ring_slot(g);
    const std::uint32_t raw_bar = plane ? bar.raw_v(s) : bar.raw_k(s);
    if (g >= W::kSlots) sm90::mbar_wait(plane ? bar.empty_v(s) : bar.empty_k(s), ring_parity(g) ^ 1u);
    load_raw(plane, i, s, raw_bar);
  };
  if (ptid == 0 && n > 0) {
    issue(0, 0);
    issue(1, 0);
  }
  for (int i = 0; i < n; ++i) {
    const int g = g0 + i, s = ring_slot(g);
    const std::uint32_t parity = ring_parity(g);
    if (ptid == 0 && i + 1 < n) issue(0, i + 1);
    sm90::mbar_wait(bar.raw_k(s), parity);
    widen(0, i, smem + W::kK + s * W::kPlaneBytes, ptid, false);
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(W::kWidenBar, 128);
    if (every_thread || ptid == 0) sm90::mbar_arrive(bar.full_k(s));
    sm90::mbar_wait(bar.raw_v(s), parity);
    widen(1, i, smem + W::kV + s * W::kPlaneBytes, ptid, entries.block[i] == tail_block && ptid >= tail_keys);
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(W::kWidenBar, 128);
    if (every_thread || ptid == 0) sm90::mbar_arrive(bar.full_v(s));
    if (ptid == 0 && i + 1 < n) issue(1, i + 1);
  }
}

}  // namespace msa::cuda::attention
