// The fp8 (e4m3, e5m2) producer of the wgmma token-tile kernel: raw K / V
// tiles by TMA into the slots' upper halves, widened in place to the MMA type
// row by row by the whole producer warpgroup (widen_blocks, load.cuh), with
// the per-(token, head) scales copied next to the slot when the cache has them.
#pragma once

#include <cstdint>

#include "cuda/attention/prefill/layout.cuh"
#include "cuda/attention/prefill/load.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

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

// The token tiles' producer of a tile's blocks for fp8 caches
// (Format<kKind>::TileProducer, format.cuh), by the producer warpgroup (ptid).
struct Fp8TileProducer {
  template <KvKind kKind, bool kF16, bool kScaled>
  __device__ __forceinline__ static void stream(const AttendParams& p, const KvMaps& maps, const TileEntries& entries,
                                                int n, int head, int tail_block, int tail_keys, unsigned char* smem,
                                                const WgmmaBars& bar, int lane, int ptid, int g0, int& tails,
                                                int k_issued) {
    (void)lane, (void)tails, (void)k_issued;
    widen_fp8_blocks<kKind, kF16>(p, maps, entries, n, head, tail_block, tail_keys, smem, bar, ptid, g0);
  }
};

}  // namespace msa::cuda::attention
