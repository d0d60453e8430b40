// Bit-exact scalar conversions between float and the storage formats of msa:
// bf16, fp16, fp8 e4m3fn, fp8 e5m2 and e2m1 (nvfp4 element). Written once for
// the host and the device (MSA_HD), so the CPU engine and the CUDA kernels
// encode and decode identically.
//
// Rules (all encoders round to nearest, ties to even):
//  - bf16, fp16: overflow gives inf; NaN gives the canonical NaN 0x7FFF.
//  - fp8 e4m3fn: saturating (|x| > 448 and +-inf give +-448); NaN gives 0x7F.
//  - fp8 e5m2: saturating (|x| > 57344 and +-inf give +-57344); NaN gives 0x7F.
//  - e2m1: saturating to +-6; results that round to zero are +0 (negative zero is
//    never written); NaN gives +0.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "msa/common.hpp"

namespace msa::num {

MSA_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
MSA_HD float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bf16 ------------------------------------------------------------------
MSA_HD float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }
MSA_HD std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

namespace detail {
// Encodes the magnitude a (finite, >= 0) into a format with M mantissa bits and
// exponent bias B, rounding to nearest even. Returns the unsigned code, which
// may exceed the format's largest finite code (the caller saturates).
template <int M, int B>
MSA_HD std::uint32_t encode_magnitude(float a) {
  const std::uint32_t u = float_bits(a);
  const int e = int((u >> 23) & 0xFFu) - 127;
  if (e < 1 - B) {
    // Below the smallest normal: a subnormal code (exact power-of-two scaling).
    return static_cast<std::uint32_t>(rintf(a * bits_float(std::uint32_t(127 + B - 1 + M) << 23)));
  }
  constexpr int kShift = 23 - M;
  std::uint32_t r = u + ((1u << (kShift - 1)) - 1u) + ((u >> kShift) & 1u);
  r &= ~((1u << kShift) - 1u);
  const int er = int(r >> 23) - 127;
  const std::uint32_t mant = (r & 0x7FFFFFu) >> kShift;
  return (std::uint32_t(er + B) << M) | mant;
}

template <int M, int B>
MSA_HD float decode_magnitude(std::uint32_t e, std::uint32_t m) {
  if (e == 0) return ldexpf(float(m), 1 - B - M);
  return ldexpf(float((1u << M) | m), int(e) - B - M);
}
}  // namespace detail

// ---- fp16 ------------------------------------------------------------------
MSA_HD float fp16_to_float(std::uint16_t h) {
  const std::uint32_t s = h >> 15, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float v;
  if (e == 0x1F) v = m ? NAN : INFINITY;
  else v = detail::decode_magnitude<10, 15>(e, m);
  return s ? -v : v;
}
MSA_HD std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t s = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t au = u & 0x7FFFFFFFu;
  if (au > 0x7F800000u) return 0x7FFF;
  if (au == 0x7F800000u) return s | 0x7C00;
  std::uint32_t c = detail::encode_magnitude<10, 15>(bits_float(au));
  if (c > 0x7BFFu) c = 0x7C00u;  // overflow rounds to inf
  return static_cast<std::uint16_t>(s | c);
}

// ---- fp8 e4m3fn --------------------------------------------------------------
MSA_HD float e4m3_to_float(std::uint8_t c) {
  const std::uint32_t s = c >> 7, e = (c >> 3) & 0xFu, m = c & 7u;
  float v = (e == 0xF && m == 7) ? NAN : detail::decode_magnitude<3, 7>(e, m);
  return s ? -v : v;
}
MSA_HD std::uint8_t float_to_e4m3(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint8_t s = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t au = u & 0x7FFFFFFFu;
  if (au > 0x7F800000u) return 0x7F;
  if (au == 0x7F800000u) return s | 0x7E;
  std::uint32_t c = detail::encode_magnitude<3, 7>(bits_float(au));
  if (c > 0x7Eu) c = 0x7Eu;
  return static_cast<std::uint8_t>(s | c);
}

// ---- fp8 e5m2 ----------------------------------------------------------------
MSA_HD float e5m2_to_float(std::uint8_t c) {
  const std::uint32_t s = c >> 7, e = (c >> 2) & 0x1Fu, m = c & 3u;
  float v;
  if (e == 0x1F) v = m ? NAN : INFINITY;
  else v = detail::decode_magnitude<2, 15>(e, m);
  return s ? -v : v;
}
MSA_HD std::uint8_t float_to_e5m2(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint8_t s = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t au = u & 0x7FFFFFFFu;
  if (au > 0x7F800000u) return 0x7F;
  if (au == 0x7F800000u) return s | 0x7B;
  std::uint32_t c = detail::encode_magnitude<2, 15>(bits_float(au));
  if (c > 0x7Bu) c = 0x7Bu;
  return static_cast<std::uint8_t>(s | c);
}

// ---- e2m1 (4-bit) ------------------------------------------------------------
// Magnitudes of codes 0..7: {0, 0.5, 1, 1.5, 2, 3, 4, 6}; bit 3 is the sign.
MSA_HD float e2m1_to_float(std::uint8_t code) {
  const std::uint32_t m = code & 7u;
  const float v = m < 4 ? 0.5f * float(m) : (m < 6 ? float(m - 2) : float(2 * m - 8));
  return (code & 8u) ? -v : v;
}
MSA_HD std::uint8_t float_to_e2m1(float f) {
  if (f != f) return 0;  // NaN
  const float a = fabsf(f);
  std::uint8_t m;
  // Round to nearest, ties to the even code (codes 0, 2, 4, 6 are even).
  if (a <= 0.25f) m = 0;
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return (m != 0 && f < 0.0f) ? std::uint8_t(m | 8u) : m;
}

// ---- generic by dtype code ----------------------------------------------------
// Storage type tags: 0 bf16, 1 fp16, 2 e4m3, 3 e5m2 (used by templated kernels).
template <int Tag>
MSA_HD float load_as_float(const void* p, std::int64_t i);
template <>
MSA_HD float load_as_float<0>(const void* p, std::int64_t i) {
  return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
}
template <>
MSA_HD float load_as_float<1>(const void* p, std::int64_t i) {
  return fp16_to_float(static_cast<const std::uint16_t*>(p)[i]);
}
template <>
MSA_HD float load_as_float<2>(const void* p, std::int64_t i) {
  return e4m3_to_float(static_cast<const std::uint8_t*>(p)[i]);
}
template <>
MSA_HD float load_as_float<3>(const void* p, std::int64_t i) {
  return e5m2_to_float(static_cast<const std::uint8_t*>(p)[i]);
}

// ---- nvfp4 group quantization (contract 4.3) ---------------------------------
// Scale of one 16-element group with amax `amax` under global dequant scale s:
//   sf = e4m3_satfinite(max(amax / 6 / s, 2^-9)).
MSA_HD std::uint8_t nvfp4_group_scale(float amax, float global_scale) {
  float t = amax / 6.0f / global_scale;
  const float floor_v = 0.001953125f;  // 2^-9, the smallest e4m3 subnormal
  if (!(t >= floor_v)) t = floor_v;    // also catches NaN
  return float_to_e4m3(t);
}
// Code of one element x given the value of its group scale and the global
// scale: two roundings, x / global_scale first.
MSA_HD std::uint8_t nvfp4_encode_value(float x, float sf_value, float global_scale) {
  return float_to_e2m1(x / global_scale / sf_value);
}
// Code of one element x given its group scale code and the global scale.
MSA_HD std::uint8_t nvfp4_encode(float x, std::uint8_t sf_code, float global_scale) {
  return nvfp4_encode_value(x, e4m3_to_float(sf_code), global_scale);
}

}  // namespace msa::num
