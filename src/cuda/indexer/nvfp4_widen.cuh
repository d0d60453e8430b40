// Widening of one nvfp4 index page into the key stage of the prefill wgmma
// kernel (prefill_scores.cu): the layout the bf16 path's tensor loads write,
// so that the same MMAs read it.
//
// Raw page (MSA_CONTRACT 4.2), as a bulk copy leaves it in shared memory:
// [128 keys][72 bytes], per key 64 code bytes (features 2i, 2i + 1 in the low
// and high nibble of byte i) then 8 e4m3 group scales (features 16g .. 16g + 15).
// Stage: two boxes (features 0-63, 64-127) of [128 keys][128 bytes] of the MMA
// type, the 16-byte chunk c of key r at chunk c ^ (r & 7) (the 128-byte
// swizzle). e2m1 x e4m3 is exact in bf16 and in fp16; the cache's global scale
// is left to the block max.
#pragma once

#include <cstdint>

#include "cuda/attention/shared/convert.cuh"
#include "msa/cache.hpp"
#include "msa/common.hpp"

namespace msa::cuda::indexer {

// Thread `thread` of kThreads widens group thread % 8 (16 features) of keys
// thread / 8, + kThreads / 8, ...: a warp's 32 groups are 4 keys x 8 groups,
// its code reads cover 4 rows, and each of its two 16-byte stores per group
// spreads over every bank. Both pointers must be visibly shared memory (derived
// from a __shared__ array by pointer arithmetic), so that the accesses compile
// to shared loads and stores the compiler may overlap across keys.
//   raw:   [128][72] bytes, 8-byte aligned
//   stage: [2][128][64] of the MMA type (bf16, fp16 when kF16), 1024-byte aligned
template <bool kF16, int kThreads>
__device__ __forceinline__ void widen_nvfp4_page(const std::uint8_t* raw, std::uint8_t* stage, int thread) {
  static_assert(kThreads % 8 == 0, "a thread keeps one group");
  constexpr int kStride = kThreads / 8;  // keys between a thread's groups
  constexpr int kBoxBytes = kBlockSize * 128;
  const int group = thread & 7;
  const int chunk = 2 * (group & 3);
  const std::uint8_t* codes_at = raw + 8 * group;
  const std::uint8_t* scale_at = raw + index_nvfp4::kDataBytes + group;
  std::uint8_t* box = stage + (group >> 2) * kBoxBytes;
  // Two keys per round, both loaded before either is stored (the compiler
  // cannot tell the raw page from the stage apart); the second of the last
  // round may lie past the page: loaded from key 127, not stored.
  for (int key = thread >> 3; key < kBlockSize; key += 2 * kStride) {
    int keys[2] = {key, key + kStride};
    uint2 codes[2];
    std::uint32_t sf[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = min(keys[i], kBlockSize - 1) * int(index_nvfp4::kRowBytes);
      codes[i] = *reinterpret_cast<const uint2*>(codes_at + row);
      sf[i] = scale_at[row];
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (keys[i] >= kBlockSize) break;
      const std::uint32_t scale2 = attention::e4m3_scales_to_mma<kF16>(sf[i] | (sf[i] << 8));
      std::uint8_t* line = box + keys[i] * 128;
      const int swz = keys[i] & 7;
      const uint4 lo = attention::fp4x8_to_mma<kF16>(codes[i].x, scale2);
      const uint4 hi = attention::fp4x8_to_mma<kF16>(codes[i].y, scale2);
      *reinterpret_cast<uint4*>(line + ((chunk ^ swz) << 4)) = lo;
      *reinterpret_cast<uint4*>(line + (((chunk + 1) ^ swz) << 4)) = hi;
    }
  }
}

}  // namespace msa::cuda::indexer
