// nvfp4 caches in the mma.sync kernels' stager (load.cuh): a block's K and V
// head slots (codes swizzled as fp4_fragments.hpp, then the group scales) are
// one contiguous run copied into a raw stage, and widened into the MMA-type
// tile through a byte -> two-values table (build_lut) times the group scale.
#pragma once

#include <cstdint>

#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/common/fp4_fragments.hpp"
#include "cuda/common/ptx.cuh"
#include "msa/numeric.hpp"

namespace msa::cuda::attention {

struct Fp4Staging {
  // Copies of block `page`, keys [0, valid_keys) read, the rest zero-filled.
  template <class S, class Copy>
  //   dst: the raw stage (K slot, V slot)
  __device__ __forceinline__ static void issue(const S& s, std::uint32_t dst, int /*stage*/, std::int64_t page,
                                               int valid_keys, const Copy& copy16) {
    constexpr int kNumThreads = S::kCtaThreads;
    const AttendParams& p = s.p;
    const int head = s.head, tid = s.tid;
    // K slot then V slot: one contiguous run of 2 x 9216 bytes.
    const unsigned char* src = static_cast<const unsigned char*>(p.cache.k) + nvfp4::slot_offset(p.cache, page, head, 0);
    constexpr int kChunks = 2 * kNvfp4SlotBytes / 16;
#pragma unroll 3
    for (int i = 0; i < (kChunks + kNumThreads - 1) / kNumThreads; ++i) {
      const int id = tid + i * kNumThreads;
      if (kChunks % kNumThreads != 0 && id >= kChunks) break;
      // Chunks [0, 512) are data (4 per token, swizzled as
      // fp4f::raw_offset), [512, 576) scales (2 tokens each, the second
      // token's half zero-filled past valid_keys); the same for V from 576.
      const int v = id < 576 ? 0 : 1;
      const int in_slot = id - 576 * v;
      const bool data = in_slot < 512;
      const int token = data ? in_slot >> 2 : (in_slot - 512) * 2;
      const int bytes = token >= valid_keys ? 0 : data || token + 1 < valid_keys ? 16 : 8;
      const int at = v * kNvfp4SlotBytes + (data ? fp4f::raw_offset(token, in_slot & 3) : in_slot * 16);
      copy16(dst + std::uint32_t(at), src + (bytes ? id * 16 : 0), bytes);
    }
  }

  // Widens raw stage `stage` into the tile; call after its copies landed and a __syncthreads.
  template <class S>
  __device__ __forceinline__ static void widen(const S& stager, int stage, int valid_keys) {
    using L = typename S::Layout;
    constexpr int kNumThreads = S::kCtaThreads;
    unsigned char* smem = stager.smem;
    const int tid = stager.tid;
    const unsigned char* raw = smem + L::kRaw + stage * L::kRawBytes;
    unsigned char* tile = smem + L::kTile;
    const auto* lut = reinterpret_cast<const std::uint32_t*>(smem + L::kLut);
#pragma unroll 2
    for (int i = 0; i < 2 * kBlockKeys * 4 / kNumThreads; ++i) {
      const int id = tid + i * kNumThreads;
      const int tensor = id >> 9, token = (id >> 2) & 127, quarter = id & 3;
      const unsigned char* slot = raw + tensor * kNvfp4SlotBytes;
      unsigned char* row = tile + tensor * kTileBytes;
      if (token >= valid_keys) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          *reinterpret_cast<uint4*>(row + tile_offset(token, 4 * quarter + j)) = make_uint4(0, 0, 0, 0);
        continue;
      }
      const uint4 d = *reinterpret_cast<const uint4*>(slot + fp4f::raw_offset(token, quarter));
      const std::uint16_t sc = *reinterpret_cast<const std::uint16_t*>(slot + 8192 + token * 8 + quarter * 2);
      const std::uint32_t sf = f16x2_to_mma<S::kF16Mma>(e4m3x2_to_f16x2(sc));
      const std::uint32_t s0 = (sf & 0xffffu) * 0x10001u;  // group 2*quarter, both halves
      const std::uint32_t s1 = (sf >> 16) * 0x10001u;      // group 2*quarter + 1
      const std::uint32_t words[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const std::uint32_t wd = words[j];
        const std::uint32_t s = j < 2 ? s0 : s1;
        uint4 o;
        o.x = mul2<S::kF16Mma>(lut[wd & 0xffu], s);
        o.y = mul2<S::kF16Mma>(lut[(wd >> 8) & 0xffu], s);
        o.z = mul2<S::kF16Mma>(lut[(wd >> 16) & 0xffu], s);
        o.w = mul2<S::kF16Mma>(lut[wd >> 24], s);
        *reinterpret_cast<uint4*>(row + tile_offset(token, 4 * quarter + j)) = o;
      }
    }
  }

  // The table byte -> (e2m1(low nibble), e2m1(high nibble)) in the MMA type.
  template <class S>
  __device__ __forceinline__ static void build_lut(const S& s) {
    using L = typename S::Layout;
    constexpr int kNumThreads = S::kCtaThreads;
    auto* lut = reinterpret_cast<std::uint32_t*>(s.smem + L::kLut);
    for (int b = s.tid; b < 256; b += kNumThreads)
      lut[b] = pack2<S::kF16Mma>(num::e2m1_to_float(std::uint8_t(b & 15)), num::e2m1_to_float(std::uint8_t(b >> 4)));
  }
};

}  // namespace msa::cuda::attention
