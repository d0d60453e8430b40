// bf16 / fp16 caches in the mma.sync kernels' stager (load.cuh): the block is
// copied as stored, straight into the stage's K and V tiles (swizzled 16-byte
// chunks), and needs no widening.
#pragma once

#include <cstdint>

#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

struct HalfStaging {
  // Copies of block `page`, keys [0, valid_keys) read, the rest zero-filled.
  template <class S, class Copy>
  //   dst: the stage's K tile, then its V tile
  __device__ __forceinline__ static void issue(const S& s, std::uint32_t dst, int /*stage*/, std::int64_t page,
                                               int valid_keys, const Copy& copy16) {
    constexpr int kNumThreads = S::kCtaThreads;
    const AttendParams& p = s.p;
    const int head = s.head, tid = s.tid;
    const std::int64_t base = p.cache.offset(page, head, 0, 0);
    const unsigned char* k = static_cast<const unsigned char*>(p.cache.k) + base * 2;
    const unsigned char* v = static_cast<const unsigned char*>(p.cache.v) + base * 2;
    const std::int64_t tstride = p.cache.token_stride * 2;
#pragma unroll 4
    for (int i = 0; i < kBlockKeys * 16 / kNumThreads; ++i) {
      const int id = tid + i * kNumThreads;
      const int token = id >> 4, c = id & 15;
      const int bytes = token < valid_keys ? 16 : 0;
      const std::int64_t off = bytes ? token * tstride + c * 16 : 0;
      copy16(dst + tile_offset(token, c), k + off, bytes);
      copy16(dst + kTileBytes + tile_offset(token, c), v + off, bytes);
    }
  }

  template <class S>
  __device__ __forceinline__ static void widen(const S&, int, int) {}
  template <class S>
  __device__ __forceinline__ static void build_lut(const S&) {}
};

}  // namespace msa::cuda::attention
