// The producer side of the wgmma token-tile kernel: K / V tiles of a tile's
// union blocks into the two-slot rings, by TMA straight into the slots
// (bf16 / fp16, one warp) or as raw fp8 / nvfp4 codes widened in place by the
// whole producer warpgroup; the tail block's unwritten V rows are zeroed.
#pragma once

#include <cstdint>

#include "cuda/common/fp4_fragments.hpp"
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

// Widens row r of an fp8 K or V slot in place: the raw row (128 codes at
// slot + kAtomBytes + 128 r, where the TMA put it: the slot's upper half) to
// the MMA type in the swizzled layout, dims 0-63 into the lower half, dims
// 64-127 over the raw rows. The second half lands exactly on raw row r, which
// this thread has read by then; no other row is touched. zero: a zero row.
template <KvKind kKind, bool kF16>
__device__ __forceinline__ void widen_row(unsigned char* slot, int r, bool zero) {
  const unsigned char* raw = slot + WgmmaTile::kAtomBytes + r * 128;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint4 in[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      in[j] = zero ? make_uint4(0, 0, 0, 0) : *reinterpret_cast<const uint4*>(raw + 64 * half + 16 * j);
#pragma unroll
    for (int c = 0; c < 8; ++c) {  // 16-byte output chunk c: codes 8c .. 8c + 7 of this half
      const std::uint32_t lo = (c & 1) ? in[c >> 1].z : in[c >> 1].x;
      const std::uint32_t hi = (c & 1) ? in[c >> 1].w : in[c >> 1].y;
      *reinterpret_cast<uint4*>(slot + half * WgmmaTile::kAtomBytes + r * 128 + ((c ^ (r & 7)) << 4)) =
          fp8x8_to_mma<kKind, kF16>(lo, hi);
    }
  }
}

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

// fp8 producer: widen_blocks over raw tiles loaded by TMA into the slots'
// upper halves, widened by widen_row. Per-(token, head) scales (p.cache.k_scales
// non-null): each thread also copies its key's K or V scale of the block into
// the slot's scale array (WgmmaTile::kScales), the V scale 0 where the V row
// is zero, once it has seen the consumers release the slot; each thread then
// publishes the slot itself (every_thread_arrives).
template <KvKind kKind, bool kF16>
__device__ __forceinline__ void widen_fp8_blocks(const AttendParams& p, const KvMaps& maps, const TileEntries& entries,
                                                 int n, int head, int tail_block, int tail_keys, unsigned char* smem,
                                                 const WgmmaBars& bar, int ptid, int g0) {
  using W = WgmmaTile;
  constexpr int kRawBytes = kBlockKeys * kDim;  // 16 KiB of codes per tile
  auto load_raw = [&](int plane, int i, int s, std::uint32_t raw_bar) {
    const int page = entries.page[i];
    sm90::mbar_arrive_expect_tx(raw_bar, kRawBytes);
    sm90::tma_load_4d(smem_u32(smem + (plane ? W::kV : W::kK) + s * W::kPlaneBytes + W::kAtomBytes),
                      plane ? &maps.v : &maps.k, raw_bar, 0, map_coord(maps, 1, head, page),
                      map_coord(maps, 2, head, page), map_coord(maps, 3, head, page));
  };
  // The thread's key's K and V scales of the next block, loaded a block ahead.
  const float* token_scales[2] = {p.cache.k_scales, p.cache.v_scales};
  auto scale_of = [&](int plane, int i) {
    return token_scales[plane][(std::int64_t(entries.page[i]) * kBlockKeys + ptid) * p.num_kv_heads + head];
  };
  float next[2] = {0.0f, 0.0f};
  if (p.cache.k_scales != nullptr && n > 0) next[0] = scale_of(0, 0), next[1] = scale_of(1, 0);
  widen_blocks(entries, n, tail_block, tail_keys, smem, bar, ptid, g0, every_thread_arrives(p), load_raw,
               [&](int plane, int i, unsigned char* slot, int r, bool zero) {
                 if (p.cache.k_scales != nullptr) {
                   const float value = next[plane];
                   if (i + 1 < n) next[plane] = scale_of(plane, i + 1);
                   const int g = g0 + i, s = ring_slot(g);
                   // The slot's scales are read by the consumers' generic loads until they
                   // release the slot: every writer waits for that release itself (thread 0's
                   // wait before the raw load orders them only through the TMA's completion).
                   if (g >= W::kSlots) sm90::mbar_wait(plane ? bar.empty_v(s) : bar.empty_k(s), ring_parity(g) ^ 1u);
                   reinterpret_cast<float*>(smem + W::kScales)[(s * 2 + plane) * kBlockKeys + r] = zero ? 0.0f : value;
                 }
                 widen_row<kKind, kF16>(slot, r, zero);
               });
}

// Widens row r of an nvfp4 K or V slot in place: the raw slot (MSA_CONTRACT
// 4.3: [128][64] code bytes, then [128][8] e4m3 group scales) sits at the top
// of the plane (kRawFp4Offset), where the bulk copy put it; the row's 64 code
// bytes and 8 scales go to registers, every thread of the warpgroup passes
// the widen barrier (the widened rows overwrite raw ones of other rows), then
// the row is written as the MMA type in the swizzled layout, dims 0-63 into
// the lower half and 64-127 into the upper. zero: a zero row. The products
// e2m1 x e4m3 are exact in bf16 and fp16; the global scale is applied outside.
inline constexpr int kRawFp4Offset = WgmmaTile::kPlaneBytes - kNvfp4SlotBytes;
template <bool kF16>
__device__ __forceinline__ void widen_row_fp4(unsigned char* slot, int r, bool zero) {
  const unsigned char* raw = slot + kRawFp4Offset;
  uint4 codes[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    codes[j] = zero ? make_uint4(0, 0, 0, 0) : *reinterpret_cast<const uint4*>(raw + 64 * r + 16 * j);
  const uint2 sc8 = zero ? make_uint2(0, 0) : *reinterpret_cast<const uint2*>(raw + fp4f::kScaleOffset + 8 * r);
  sm90::named_barrier_sync(WgmmaTile::kWidenBar, 128);  // every raw row is in registers
#pragma unroll
  for (int g2 = 0; g2 < 4; ++g2) {  // scale groups 2 g2, 2 g2 + 1 (dims 32 g2 .. 32 g2 + 31)
    const std::uint32_t two = g2 < 2 ? sc8.x >> (16 * g2) : sc8.y >> (16 * (g2 - 2));
    const std::uint32_t pair = e4m3_scales_to_mma<kF16>(two);
    const std::uint32_t scale[2] = {fp4f::prmt(pair, 0u, 0x1010u), fp4f::prmt(pair, 0u, 0x3232u)};
    const uint4 in = codes[g2];
    const std::uint32_t words[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // dims 32 g2 + 8 k .. + 7: output chunk c of half h
      const int chunk = 4 * g2 + k, h = chunk >> 3, c = chunk & 7;
      *reinterpret_cast<uint4*>(slot + h * WgmmaTile::kAtomBytes + r * 128 + ((c ^ (r & 7)) << 4)) =
          fp4x8_to_mma<kF16>(words[k], scale[k >> 1]);
    }
  }
}

// nvfp4 producer: widen_blocks over each block's K and V head-slot runs (one
// contiguous 9 KiB run each) bulk-copied to the top of their planes, widened
// by widen_row_fp4.
//   p: the cache (k_base, page_stride) of the launch
template <bool kF16>
__device__ __forceinline__ void widen_fp4_blocks(const AttendParams& p, const TileEntries& entries, int n, int head,
                                                 int tail_block, int tail_keys, unsigned char* smem,
                                                 const WgmmaBars& bar, int ptid, int g0) {
  using W = WgmmaTile;
  auto load_raw = [&](int plane, int i, int s, std::uint32_t raw_bar) {
    const unsigned char* src =
        static_cast<const unsigned char*>(p.cache.k) + nvfp4::slot_offset(p.cache, entries.page[i], head, plane);
    sm90::mbar_arrive_expect_tx(raw_bar, kNvfp4SlotBytes);
    sm90::bulk_load(smem_u32(smem + (plane ? W::kV : W::kK) + s * W::kPlaneBytes + kRawFp4Offset), src,
                    kNvfp4SlotBytes, raw_bar);
  };
  widen_blocks(entries, n, tail_block, tail_keys, smem, bar, ptid, g0, every_thread_arrives(p), load_raw,
               [](int, int, unsigned char* slot, int r, bool zero) { widen_row_fp4<kF16>(slot, r, zero); });
}

}  // namespace msa::cuda::attention
