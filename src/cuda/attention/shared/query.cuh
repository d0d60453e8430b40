// Query chunks (8 elements of one query head) converted to the 16-bit MMA
// type: the conversions every kernel family uses, and the token tiles' load.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

// 8 e4m3 query elements (x: the first 4) in the MMA type.
template <bool kF16>
__device__ __forceinline__ uint4 e4m3x8_to_mma(uint2 c) {
  return make_uint4(f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.x & 0xffffu))),
                    f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.x >> 16))),
                    f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.y & 0xffffu))),
                    f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.y >> 16))));
}

// 8 bf16 or fp16 (q_fp16) query elements in the MMA type.
template <bool kF16>
__device__ __forceinline__ uint4 half8_to_mma(bool q_fp16, uint4 raw) {
  if (q_fp16 == kF16) return raw;
  // bf16 <-> fp16 through float.
  std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float lo, hi;
    if (q_fp16) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      lo = f.x, hi = f.y;
    } else {
      lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
    }
    w[i] = pack2<kF16>(lo, hi);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// 8 query elements (of any query kind) in the MMA type, for the token-tile
// kernels. It does not go through load_query_raw / query_raw_to_mma: that
// form compiles the token-tile kernels' query staging differently, and their
// code stays as measured (measured on the H200; bench/RESULTS.md in git history).
//   p.q: [num_tokens, num_q_heads, 128]; elem: index of the first of the 8
template <bool kF16>
__device__ __forceinline__ uint4 load_query_chunk(const AttendParams& p, std::int64_t elem) {
  if (p.q_kind == kQueryE4m3)
    return e4m3x8_to_mma<kF16>(*reinterpret_cast<const uint2*>(static_cast<const unsigned char*>(p.q) + elem));
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p.q) + elem);
  return half8_to_mma<kF16>(p.q_kind == kQueryFp16, raw);
}

}  // namespace msa::cuda::attention
