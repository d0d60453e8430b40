// Correctly rounded float division by a divisor fixed for many quotients (a
// quantizer's scale), without an IEEE division per quotient: the reciprocal
// r = RN(1 / d) once, then per quotient
//   q0 = RN(x r),  e = x - q0 d (exact, one FMA),  q = RN(q0 + e r)
// (Markstein's correction), which is RN(x / d) while nothing under- or
// overflows: here while d and |x| lie in [2^-60, 2^60). Operands outside that
// range (0, inf, NaN, huge or tiny) take the plain division, so every
// quotient is bit-identical to x / d as the CPU engine computes it. A group of
// quotients checks the range of its operands once and takes one path for all
// of them. Host and device, so that tests/unit/test_float_divisor.cpp checks
// the identity on the host.
#pragma once

#include <cmath>
#include <cstdint>

#include "msa/common.hpp"

namespace msa::cuda {

// The smallest and largest |x[i]|, i < N, as FloatDivisor::covers takes them
// (fminf / fmaxf leave a NaN out).
template <int N>
MSA_HD void abs_range(const float* x, float& amin, float& amax) {
  amin = INFINITY;
  amax = 0.0f;
  for (int i = 0; i < N; ++i) {
    amin = fminf(amin, fabsf(x[i]));
    amax = fmaxf(amax, fabsf(x[i]));
  }
}

class FloatDivisor {
 public:
  // The range of divisors and operand magnitudes the reciprocal serves.
  static constexpr float kMin = 0x1p-60f;
  static constexpr float kMax = 0x1p60f;

  FloatDivisor() = default;
  MSA_HD explicit FloatDivisor(float divisor) : d_(divisor) {
    const bool fast = divisor >= kMin && divisor < kMax;
#if defined(__CUDA_ARCH__)
    r_ = fast ? __frcp_rn(divisor) : 0.0f;
#else
    r_ = fast ? 1.0f / divisor : 0.0f;
#endif
  }

  MSA_HD float divisor() const { return d_; }

  // Whether quotient(x) is RN(x / d) for every x with amin <= |x| <= amax
  // (amin, amax from fminf / fmaxf of |x|: a NaN operand leaves them as they
  // were, and its quotient is NaN either way).
  MSA_HD bool covers(float amin, float amax) const { return r_ > 0.0f && amin >= kMin && amax < kMax; }

  // RN(x / d) where covers(|x|, |x|): one multiply and two FMAs.
  MSA_HD float quotient(float x) const {
#if defined(__CUDA_ARCH__)
    const float q0 = __fmul_rn(x, r_);
    return __fmaf_rn(__fmaf_rn(-q0, d_, x), r_, q0);
#else
    const float q0 = x * r_;
    return std::fma(std::fma(-q0, d_, x), r_, q0);
#endif
  }

  // RN(x / d) for any x.
  MSA_HD float operator()(float x) const {
    const float a = fabsf(x);
    return covers(a, a) ? quotient(x) : x / d_;
  }

  // q[i] = RN(x[i] / d) for i < N, where amin <= |x[i]| <= amax: the
  // reciprocal for all of them or the division for all. q may be x.
  template <int N>
  MSA_HD void divide(const float* x, float* q, float amin, float amax) const {
    if (covers(amin, amax)) {
      for (int i = 0; i < N; ++i) q[i] = quotient(x[i]);
    } else {
      for (int i = 0; i < N; ++i) q[i] = x[i] / d_;
    }
  }

  // The same, the range of |x| found here.
  template <int N>
  MSA_HD void divide(const float* x, float* q) const {
    float amin, amax;
    abs_range<N>(x, amin, amax);
    divide<N>(x, q, amin, amax);
  }

 private:
  float d_ = 1.0f;
  float r_ = 1.0f;  // RN(1 / d), or 0 where d is outside [kMin, kMax)
};

}  // namespace msa::cuda
