// Exact conversions of stored KV codes to the 16-bit MMA type (bf16, or fp16
// when kF16), shared by every kernel family that reads fp8 or nvfp4 caches:
// the mma.sync mainloop (in registers), the mma.sync tiles' and the wgmma
// tiles' widening, and the widening of blocks ahead.
#pragma once

#include <cstdint>

#include "cuda/attention/params.cuh"
#include "cuda/common/fp4_fragments.hpp"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

// Two fp8 codes of an fp8 format (low byte first) -> the MMA type, exact.
template <KvKind kKind, bool kF16>
__device__ __forceinline__ std::uint32_t fp8x2_to_mma(std::uint32_t two_codes) {
  static_assert(kv_format(kKind).fp8, "fp8 formats only");
  const auto c = std::uint16_t(two_codes & 0xffffu);
  return f16x2_to_mma<kF16>(kKind == KvKind::e4m3 ? e4m3x2_to_f16x2(c) : e5m2x2_to_f16x2(c));
}

// Two e4m3 scale codes (nvfp4 group scales, low byte first) -> the MMA type, exact.
template <bool kF16>
__device__ __forceinline__ std::uint32_t e4m3_scales_to_mma(std::uint32_t two_codes) {
  return fp8x2_to_mma<KvKind::e4m3, kF16>(two_codes);
}

// Eight fp8 codes (lo: codes 0-3, hi: 4-7, low byte first) -> 16 bytes of the
// MMA type, exact.
template <KvKind kKind, bool kF16>
__device__ __forceinline__ uint4 fp8x8_to_mma(std::uint32_t lo, std::uint32_t hi) {
  return make_uint4(fp8x2_to_mma<kKind, kF16>(lo), fp8x2_to_mma<kKind, kF16>(lo >> 16),
                    fp8x2_to_mma<kKind, kF16>(hi), fp8x2_to_mma<kKind, kF16>(hi >> 16));
}

// Eight e2m1 codes (one word, MSA_CONTRACT 4.3) times their group scale
// (scale2: the scale in both halves, the MMA type) -> 16 bytes of the MMA
// type; e2m1 x e4m3 is exact in bf16 and fp16.
template <bool kF16>
__device__ __forceinline__ uint4 fp4x8_to_mma(std::uint32_t codes, std::uint32_t scale2) {
  std::uint32_t b[4];
  fp4f::e2m1x8_to_pairs<kF16>(codes, b);
#pragma unroll
  for (int e = 0; e < 4; ++e) b[e] = mul2<kF16>(b[e], scale2);
  return make_uint4(b[0], b[1], b[2], b[3]);
}

__device__ __forceinline__ std::uint32_t byte_perm(std::uint32_t x, std::uint32_t selector) {
  return __byte_perm(x, 0u, selector);
}

}  // namespace msa::cuda::attention
