// The nvfp4 producer of the wgmma token-tile kernel: each block's K and V
// head-slot runs bulk-copied to the top of their planes, widened in place to
// the MMA type row by row by the whole producer warpgroup (widen_blocks,
// load.cuh).
#pragma once

#include <cstdint>

#include "cuda/attention/prefill/layout.cuh"
#include "cuda/attention/prefill/load.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/common/fp4_fragments.hpp"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

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

// The token tiles' producer of a tile's blocks for nvfp4 caches
// (Format<kKind>::TileProducer, format.cuh), by the producer warpgroup (ptid).
struct Fp4TileProducer {
  template <KvKind kKind, bool kF16, bool kScaled>
  __device__ __forceinline__ static void stream(const AttendParams& p, const KvMaps& maps, const TileEntries& entries,
                                                int n, int head, int tail_block, int tail_keys, unsigned char* smem,
                                                const WgmmaBars& bar, int lane, int ptid, int g0, int& tails,
                                                int k_issued) {
    (void)maps, (void)lane, (void)tails, (void)k_issued;
    widen_fp4_blocks<kF16>(p, entries, n, head, tail_block, tail_keys, smem, bar, ptid, g0);
  }
};

}  // namespace msa::cuda::attention
