// fp8 (e4m3, e5m2) caches in the mma.sync kernels' stager (load.cuh): the
// block's codes are copied into a raw stage (swizzled as fp8_fragments.hpp)
// with the per-(token, head) scales when the cache has them, and widened into
// the MMA-type tile where the kernel reads a tile (the token tiles; the row
// kernel converts in registers instead).
#pragma once

#include <cstdint>

#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/common/fp8_fragments.hpp"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

struct Fp8Staging {
  // Copies of block `page`, keys [0, valid_keys) read, the rest zero-filled.
  template <class S, class Copy>
  //   dst: the raw stage (K codes, V codes); the scales go to the layout's kRawScales
  __device__ __forceinline__ static void issue(const S& s, std::uint32_t dst, int stage, std::int64_t page,
                                               int valid_keys, const Copy& copy16) {
    using L = typename S::Layout;
    constexpr int kNumThreads = S::kCtaThreads;
    const AttendParams& p = s.p;
    unsigned char* smem = s.smem;
    const int head = s.head, tid = s.tid;
    const std::int64_t base = p.cache.offset(page, head, 0, 0);
    const unsigned char* k = static_cast<const unsigned char*>(p.cache.k) + base;
    const unsigned char* v = static_cast<const unsigned char*>(p.cache.v) + base;
#pragma unroll 4
    for (int i = 0; i < kBlockKeys * 8 / kNumThreads; ++i) {
      const int id = tid + i * kNumThreads;
      const int token = id >> 3, c = id & 7;
      const int bytes = token < valid_keys ? 16 : 0;
      const std::int64_t off = bytes ? token * p.cache.token_stride + c * 16 : 0;
      const auto at = std::uint32_t(fp8f::raw_offset(token, c));  // swizzled 16-byte chunks
      copy16(dst + at, k + off, bytes);
      copy16(dst + kFp8RawBytes + at, v + off, bytes);
    }
    if (p.cache.k_scales != nullptr && tid < kBlockKeys) {
      const std::uint32_t sdst = smem_u32(smem + L::kRawScales + stage * 2 * kBlockKeys * 4);
      const int token = tid;
      const int bytes = token < valid_keys ? 4 : 0;
      const std::int64_t at = bytes ? (page * kBlockKeys + token) * p.num_kv_heads + head : 0;
      cp_async4_zfill(sdst + token * 4, p.cache.k_scales + at, bytes);
      cp_async4_zfill(sdst + (kBlockKeys + token) * 4, p.cache.v_scales + at, bytes);
    }
  }

  // Widens raw stage `stage` into the tile; call after its copies landed and a __syncthreads.
  template <class S>
  __device__ __forceinline__ static void widen(const S& s, int stage, int valid_keys) {
    using L = typename S::Layout;
    constexpr int kNumThreads = S::kCtaThreads;
    const AttendParams& p = s.p;
    unsigned char* smem = s.smem;
    const int tid = s.tid;
    const unsigned char* raw = smem + L::kRaw + stage * L::kRawBytes;
    unsigned char* tile = smem + L::kTile;
    // 16 codes (8 bytes) per (tensor, token, 8-dim chunk); keys past
    // valid_keys were zero-filled by issue(), so they widen to zeros. Each
    // thread loads a batch of codes before converting and storing any: the
    // compiler cannot tell the raw stage from the tile, so a load after a
    // store waits for it, and one load per store serialized the widening
    // (H200: fp8 decode 23-37% faster from batch 32). The nvfp4 widening
    // (stage_fp4.cuh) keeps one load per store: batching its loads (its table
    // lookups depend on them) measured 0-6% slower.
    constexpr int kIters = 2 * kBlockKeys * 16 / kNumThreads;
    constexpr int kBatch = kIters < 8 ? kIters : 8;
    static_assert(kIters % kBatch == 0, "whole batches");
#pragma unroll 1
    for (int i0 = 0; i0 < kIters; i0 += kBatch) {
      uint2 codes[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int id = tid + (i0 + j) * kNumThreads;
        const int tensor = id >> 11, token = (id >> 4) & 127, c = id & 15;
        codes[j] = *reinterpret_cast<const uint2*>(raw + tensor * kFp8RawBytes + fp8f::raw_offset(token, c >> 1) +
                                                   (c & 1) * 8);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int id = tid + (i0 + j) * kNumThreads;
        const int tensor = id >> 11, token = (id >> 4) & 127, c = id & 15;
        const uint4 o = make_uint4(to_mma<S>(std::uint16_t(codes[j].x & 0xffffu)),
                                   to_mma<S>(std::uint16_t(codes[j].x >> 16)),
                                   to_mma<S>(std::uint16_t(codes[j].y & 0xffffu)),
                                   to_mma<S>(std::uint16_t(codes[j].y >> 16)));
        *reinterpret_cast<uint4*>(tile + tensor * kTileBytes + tile_offset(token, c)) = o;
      }
    }
    if (p.cache.k_scales != nullptr && tid < kBlockKeys) {
      const float* raw_scales = reinterpret_cast<const float*>(smem + L::kRawScales) + stage * 2 * kBlockKeys;
      float* cur = reinterpret_cast<float*>(smem + L::kCurScales);
      const bool ok = tid < valid_keys;
      cur[tid] = ok ? raw_scales[tid] : 0.0f;
      cur[kBlockKeys + tid] = ok ? raw_scales[kBlockKeys + tid] : 0.0f;
    }
  }

  template <class S>
  __device__ __forceinline__ static void build_lut(const S&) {}

 private:
  template <class S>
  __device__ __forceinline__ static std::uint32_t to_mma(std::uint16_t two_codes) {
    return fp8x2_to_mma<S::kKindValue, S::kF16Mma>(two_codes);
  }
};

}  // namespace msa::cuda::attention
