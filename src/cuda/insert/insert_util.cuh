// Small pieces shared by the insert kernels: 8-element loads of a bf16/fp16
// source and 8-element stores into a bf16/fp16/fp8 cache row, 16- or 8-byte
// wide when the address is aligned (views may have any strides), element-wise
// otherwise; the nvfp4 quantizer of 8 elements. Conversions give the codes of
// msa/numeric.hpp bit for bit: the hardware's paired round-to-nearest-even
// conversions agree with them on every input but NaN, whose code is fixed here.
// Quotients by a scale are the CPU's x / scale bit for bit, through the
// scale's reciprocal (FloatDivisor) rather than a division per element.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "cuda/common/e2m1_code.hpp"
#include "cuda/common/float_divisor.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cuda::insert_detail {

// Source dtype tags.
inline constexpr int kSrcBf16 = 0;
inline constexpr int kSrcFp16 = 1;
// Cache dtype tags.
inline constexpr int kDstBf16 = 0;
inline constexpr int kDstFp16 = 1;
inline constexpr int kDstE4m3 = 2;
inline constexpr int kDstE5m2 = 3;
inline constexpr int kDstNvfp4 = 4;

// The tag of a cache dtype; throws msa::Error naming `what` for any other.
inline int dst_tag(DType t, const char* what) {
  switch (t) {
    case DType::bf16: return kDstBf16;
    case DType::fp16: return kDstFp16;
    case DType::fp8_e4m3: return kDstE4m3;
    case DType::fp8_e5m2: return kDstE5m2;
    case DType::nvfp4: return kDstNvfp4;
    default: fail(what, " = ", dtype_name(t), " is not a cache dtype");
  }
}

// Calls f with the cache dtype tag `dst` as a compile-time constant
// (std::integral_constant<int, kDst...>), for launchers of kernels templated on it.
template <class F>
void with_dst_tag(int dst, F&& f) {
  switch (dst) {
    case kDstBf16: return f(std::integral_constant<int, kDstBf16>{});
    case kDstFp16: return f(std::integral_constant<int, kDstFp16>{});
    case kDstE4m3: return f(std::integral_constant<int, kDstE4m3>{});
    case kDstE5m2: return f(std::integral_constant<int, kDstE5m2>{});
    default: return f(std::integral_constant<int, kDstNvfp4>{});
  }
}

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) & (bytes - 1)) == 0;
}

template <int Src>
__device__ __forceinline__ float half_to_float(std::uint16_t h) {
  if constexpr (Src == kSrcBf16) return num::bf16_to_float(h);
  else return __half2float(__ushort_as_half(h));  // exact
}

// x[e] = src[e] for e < 8, as float.
//   src: [8] bf16 or fp16 bits
template <int Src>
__device__ __forceinline__ void load8(const std::uint16_t* src, float* x) {
  if (aligned(src, 16)) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[2 * e] = half_to_float<Src>(static_cast<std::uint16_t>(w[e] & 0xFFFFu));
      x[2 * e + 1] = half_to_float<Src>(static_cast<std::uint16_t>(w[e] >> 16));
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = half_to_float<Src>(src[e]);
  }
}

// The bf16 / fp16 codes of (a, b), a in the low half; NaN gives 0x7FFF.
template <int Dst>
__device__ __forceinline__ std::uint32_t half2_codes(float a, float b) {
  static_assert(Dst == kDstBf16 || Dst == kDstFp16);
  std::uint32_t w;
  if constexpr (Dst == kDstBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&w, &h, sizeof(w));
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&w, &h, sizeof(w));
  }
  if (__builtin_expect(a != a || b != b, 0)) {
    if (a != a) w = (w & 0xFFFF0000u) | 0x7FFFu;
    if (b != b) w = (w & 0x0000FFFFu) | 0x7FFF0000u;
  }
  return w;
}

// The saturating e4m3 / e5m2 codes of (a, b), a in the low byte; NaN gives 0x7F.
template <int Dst>
__device__ __forceinline__ std::uint32_t fp8x2_codes(float a, float b) {
  static_assert(Dst == kDstE4m3 || Dst == kDstE5m2);
  std::uint32_t w = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                             Dst == kDstE4m3 ? __NV_E4M3 : __NV_E5M2);
  if (__builtin_expect(a != a || b != b, 0)) {
    if (a != a) w = (w & 0xFF00u) | 0x7Fu;
    if (b != b) w = (w & 0x00FFu) | 0x7F00u;
  }
  return w;
}

// Stores f(x[0..8)) at element offset `off` of an fp8 cache base.
template <int Dst, class F>
__device__ __forceinline__ void store8_fp8(void* base, std::int64_t off, const float* x, const F& f) {
  std::uint8_t* dst = static_cast<std::uint8_t*>(base) + off;
  std::uint32_t w[2];
#pragma unroll
  for (int e = 0; e < 2; ++e)
    w[e] = fp8x2_codes<Dst>(f(x[4 * e]), f(x[4 * e + 1])) | (fp8x2_codes<Dst>(f(x[4 * e + 2]), f(x[4 * e + 3])) << 16);
  if (aligned(dst, 8)) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = static_cast<std::uint8_t>(w[e >> 2] >> (8 * (e & 3)));
  }
}

// Stores x[0..8) at element offset `off` of a bf16/fp16/fp8 cache base, as
// they are (fp8: the plain saturating cast).
template <int Dst>
__device__ __forceinline__ void store8(void* base, std::int64_t off, const float* x) {
  if constexpr (Dst == kDstBf16 || Dst == kDstFp16) {
    std::uint16_t* dst = static_cast<std::uint16_t*>(base) + off;
    std::uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = half2_codes<Dst>(x[2 * e], x[2 * e + 1]);
    if (aligned(dst, 16)) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        dst[e] = static_cast<std::uint16_t>(w[e >> 1] >> (16 * (e & 1)));
    }
  } else {
    store8_fp8<Dst>(base, off, x, [](float v) { return v; });
  }
}

// The fp8 codes of x / scale (the fp8 caches' and queries' scales): the range
// of |x| checked once, then the reciprocal or the division for all eight.
template <int Dst>
__device__ __forceinline__ void store8(void* base, std::int64_t off, const float* x, const FloatDivisor& scale) {
  static_assert(Dst == kDstE4m3 || Dst == kDstE5m2, "only fp8 stores are scaled");
  float amin, amax;
  abs_range<8>(x, amin, amax);
  if (scale.covers(amin, amax)) store8_fp8<Dst>(base, off, x, [&](float v) { return scale.quotient(v); });
  else store8_fp8<Dst>(base, off, x, [&](float v) { return v / scale.divisor(); });
}

// Stores 4 bytes (little-endian) at p.
__device__ __forceinline__ void store_bytes4(std::uint8_t* p, std::uint32_t bytes) {
  if (aligned(p, 4)) {
    *reinterpret_cast<std::uint32_t*>(p) = bytes;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = static_cast<std::uint8_t>(bytes >> (8 * e));
  }
}

// The value of an e4m3 code (exact: every e4m3 value is an fp16 value).
__device__ __forceinline__ float e4m3_value(std::uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// Quantizes 8 elements (8c .. 8c+7 of one row) to nvfp4 (contract 4.3), as
// cpu::insert_* does: lanes c and c ^ 1 hold one 16-element group, so its amax
// is one shuffle; this lane writes its 4 data bytes and, from even c, the
// group's scale byte (its value decoded once for the group's elements). The
// codes are of x / global / group scale, two correctly rounded quotients as
// num::nvfp4_encode_value's, encoded without branches (e2m1_code). `mask`
// names the lanes that execute this call (it must include both lanes of the
// pair).
//   data: [64] data bytes of the row, scales: [8] scale bytes of the row
__device__ __forceinline__ void store_nvfp4_8(const float* x, const FloatDivisor& global, int c, unsigned mask,
                                              std::uint8_t* data, std::uint8_t* scales) {
  float amin, amax;  // of this lane's |x|
  abs_range<8>(x, amin, amax);
  const float group_amax = fmaxf(amax, __shfl_xor_sync(mask, amax, 1));  // the other half of the group
  const std::uint8_t sf = num::nvfp4_group_scale(group_amax, global.divisor());
  // t = x / global, then t / sf: the second range from the first's quotients
  // of amin and amax (division is monotonic), when the first is covered.
  float t[8];
  global.divide<8>(x, t, amin, amax);
  const FloatDivisor by_sf(e4m3_value(sf));
  const bool covered = global.covers(amin, amax);
  const float tmin = covered ? global.quotient(amin) : 0.0f, tmax = covered ? global.quotient(amax) : 0.0f;
  by_sf.divide<8>(t, t, tmin, tmax);
  std::uint32_t bytes = 0;
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const std::uint32_t lo = e2m1_code(t[e]);
    const std::uint32_t hi = e2m1_code(t[e + 1]);
    bytes |= (lo | (hi << 4)) << (4 * e);
  }
  store_bytes4(data + 4 * c, bytes);
  if ((c & 1) == 0) scales[c >> 1] = sf;
}

}  // namespace msa::cuda::insert_detail
