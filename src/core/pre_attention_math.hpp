// The arithmetic of pre-attention (SEMANTICS in msa/pre_attention.hpp), written
// once for the CPU engine and the CUDA kernel so that both round at the same
// points: every fp32 operation is rounded on its own and none is fused.
//
// On the device the _rn intrinsics are never contracted into FMAs. On the host
// each operation runs in double and is rounded to float once: the exact
// product of two floats fits a double, and for +, -, *, / and sqrt rounding
// through double (53 >= 2 * 24 + 2 bits) gives the correctly rounded fp32
// result, whatever contraction the host compiler allows.
#pragma once

#include <cmath>
#include <cstdint>

#include "msa/common.hpp"
#include "msa/pre_attention.hpp"

namespace msa::pre {

MSA_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return float(double(a) * double(b));
#endif
}
MSA_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return float(double(a) + double(b));
#endif
}
MSA_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return float(double(a) - double(b));
#endif
}

// The partial sum of squares of 8 consecutive values, in order.
//   x: [8]
MSA_HD float sum_squares8(const float* x) {
  float s = mul(x[0], x[0]);
  for (int e = 1; e < 8; ++e) s = add(s, mul(x[e], x[e]));
  return s;
}

// r = 1 / sqrt(s * 2^-7 + eps) from the sum of squares s of a head.
MSA_HD float rms_factor(float s, float eps) {
  const float m = add(mul(s, 0.0078125f), eps);
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, __fsqrt_rn(m));
#else
  const float root = float(std::sqrt(double(m)));
  return float(1.0 / double(root));
#endif
}

// One normed value: (x * r) * g with the gain g = 1 + w (norm_gain).
MSA_HD float norm_gain(float w) { return add(1.0f, w); }
MSA_HD float norm_scaled(float x, float r, float g) { return mul(mul(x, r), g); }
MSA_HD float norm_value(float x, float r, float w) { return norm_scaled(x, r, norm_gain(w)); }

// RoPE of the pair (a, b) = (y[j], y[j + 32]) with c = cos, s = sin of column j:
// the new y[j] and the new y[j + 32].
MSA_HD float rope_first(float a, float b, float c, float s) { return sub(mul(a, c), mul(b, s)); }
MSA_HD float rope_second(float a, float b, float c, float s) { return add(mul(b, c), mul(a, s)); }

// Which part of a qkv row head `j` belongs to.
enum class HeadKind : std::uint8_t { q, k, v, index_q, index_k };

// Head j of a row of nq query, nkv K, nkv V, niq index-query heads and one index-key head.
MSA_HD HeadKind head_kind(std::int64_t j, std::int64_t nq, std::int64_t nkv, std::int64_t niq) {
  if (j < nq) return HeadKind::q;
  if (j < nq + nkv) return HeadKind::k;
  if (j < nq + 2 * nkv) return HeadKind::v;
  if (j < nq + 2 * nkv + niq) return HeadKind::index_q;
  return HeadKind::index_k;
}

// Steps 1 and 2 of the SEMANTICS for a whole head, on the host (the kernel
// spreads the same operations over 16 lanes of 8 values).
//   x: [128]   w: [128] the head's norm weight   cs: [64] the position's cos/sin row
//   out: [128] z (not yet rounded to the qkv dtype)
inline void norm_rope_head(const float* x, const float* w, const float* cs, float eps, float* out) {
  float p[16];
  for (int c = 0; c < 16; ++c) p[c] = sum_squares8(x + 8 * c);
  for (int m = 8; m >= 1; m >>= 1)
    for (int c = 0; c < m; ++c) p[c] = add(p[c], p[c + m]);
  const float r = rms_factor(p[0], eps);
  for (int d = 0; d < kHeadDim; ++d) out[d] = norm_value(x[d], r, w[d]);
  constexpr int half = kRopeDims / 2;
  for (int j = 0; j < half; ++j) {
    const float a = out[j], b = out[j + half], c = cs[j], s = cs[half + j];
    out[j] = rope_first(a, b, c, s);
    out[j + half] = rope_second(a, b, c, s);
  }
}

}  // namespace msa::pre
