#include "pre_attention_ref.hpp"

#include <cmath>
#include <cstdint>

#include "cache_reader.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::ref {

namespace {

constexpr int kDim = 128;
constexpr int kHalf = kRopeDims / 2;
constexpr double kSlack = 0x1p-18;

float round_to(DType t, double x) {
  const float f = float(x);
  return t == DType::bf16 ? num::bf16_to_float(num::float_to_bf16(f))
                          : num::fp16_to_float(num::float_to_fp16(f));
}

}  // namespace

float PreAttentionRef::rounded(std::int64_t token, std::int64_t head, int d) const {
  return round_to(dtype, z[std::size_t(index(token, head, d))]);
}

bool PreAttentionRef::admits(std::int64_t token, std::int64_t head, int d, float u) const {
  const std::size_t i = std::size_t(index(token, head, d));
  if (std::isnan(z[i])) return std::isnan(u);
  const float lo = round_to(dtype, z[i] - slack[i]), hi = round_to(dtype, z[i] + slack[i]);
  return u >= lo && u <= hi;
}

bool PreAttentionRef::ambiguous(std::int64_t token, std::int64_t head, int d) const {
  const std::size_t i = std::size_t(index(token, head, d));
  return round_to(dtype, z[i] - slack[i]) != round_to(dtype, z[i] + slack[i]);
}

PreAttentionRef pre_attention_reference(const PreAttentionArgs& a) {
  PreAttentionRef r;
  r.num_tokens = a.num_tokens;
  r.heads = a.heads_per_token();
  r.dtype = a.qkv_dtype;
  r.z.assign(std::size_t(r.num_tokens * r.heads * kDim), 0.0);
  r.slack.assign(r.z.size(), 0.0);
  const std::int64_t nq = a.num_q_heads, nkv = a.num_kv_heads, niq = a.num_index_heads;
  const void* weights[4] = {a.q_weight, a.k_weight, a.index_q_weight, a.index_k_weight};
  double w[4][kDim];
  for (int k = 0; k < 4; ++k)
    for (int d = 0; d < kDim; ++d) w[k][d] = read_element(weights[k], a.weight_dtype, d);
  const std::int64_t stride = a.row_stride();
  for (std::int64_t i = 0; i < a.num_tokens; ++i) {
    const std::int64_t pos = a.positions[i];
    MSA_CHECK(pos >= 0 && pos < a.max_position, "pre_attention_reference: positions[", i, "] = ", pos,
              " is outside the table of ", a.max_position, " rows");
    double cs[kRopeDims];
    for (int d = 0; d < kRopeDims; ++d) cs[d] = read_element(a.cos_sin, a.cos_sin_dtype, pos * kRopeDims + d);
    for (std::int64_t j = 0; j < r.heads; ++j) {
      double x[kDim];
      for (int d = 0; d < kDim; ++d) x[d] = read_element(a.qkv, a.qkv_dtype, i * stride + j * kDim + d);
      double* z = r.z.data() + r.index(i, j, 0);
      double* slack = r.slack.data() + r.index(i, j, 0);
      const bool is_v = j >= nq + nkv && j < nq + 2 * nkv;
      if (is_v) {
        for (int d = 0; d < kDim; ++d) z[d] = x[d];
        continue;
      }
      const int kind = j < nq ? 0 : j < nq + nkv ? 1 : j < nq + 2 * nkv + niq ? 2 : 3;
      double ss = 0.0;
      for (int d = 0; d < kDim; ++d) ss += x[d] * x[d];
      const double rms = 1.0 / std::sqrt(ss / kDim + double(a.eps));
      double y[kDim];
      for (int d = 0; d < kDim; ++d) y[d] = x[d] * rms * (1.0 + w[kind][d]);
      for (int d = 0; d < kDim; ++d) {
        z[d] = y[d];
        slack[d] = kSlack * std::fabs(y[d]);
      }
      for (int k = 0; k < kHalf; ++k) {
        const double c = cs[k], s = cs[kHalf + k], lo = y[k], hi = y[k + kHalf];
        z[k] = lo * c - hi * s;
        z[k + kHalf] = hi * c + lo * s;
        const double m = std::fabs(lo * c) + std::fabs(hi * s) + std::fabs(lo * s) + std::fabs(hi * c);
        slack[k] = kSlack * (m + std::fabs(z[k]));
        slack[k + kHalf] = kSlack * (m + std::fabs(z[k + kHalf]));
      }
    }
  }
  return r;
}

}  // namespace msa::ref
