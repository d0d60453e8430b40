#include "oracle.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace msa::ref {

namespace {

constexpr int kDim = 128;

// Dot product of two 128-vectors with 8 partial sums (a fixed order).
double dot(const double* a, const double* b) {
  double part[8] = {};
  for (int d = 0; d < kDim; d += 8) {
    for (int i = 0; i < 8; ++i) part[i] += a[d + i] * b[d + i];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// One query row over the keys j with visible(j). Two passes: the maximum
// logit, then the exponentials relative to it.
template <typename Visible>
void attend_row(const double* q, const double* k, const double* v, std::int64_t nk, double scale,
                Visible visible, double* out, double* lse) {
  std::vector<double> s(static_cast<std::size_t>(nk));
  double m = -std::numeric_limits<double>::infinity();
  bool any = false;
  for (std::int64_t j = 0; j < nk; ++j) {
    if (!visible(j)) continue;
    any = true;
    s[j] = scale * dot(q, k + j * kDim);
    if (s[j] > m) m = s[j];
  }
  for (int d = 0; d < kDim; ++d) out[d] = 0.0;
  if (!any) {
    if (lse) *lse = -std::numeric_limits<double>::infinity();
    return;
  }
  // All visible logits -inf (or NaN): subtracting m would give NaN; keep the
  // IEEE result of the plain formula instead.
  const double shift = std::isfinite(m) ? m : 0.0;
  double sum = 0.0;
  for (std::int64_t j = 0; j < nk; ++j) {
    if (!visible(j)) continue;
    const double e = std::exp(s[j] - shift);
    sum += e;
    for (int d = 0; d < kDim; ++d) out[d] += e * v[j * kDim + d];
  }
  for (int d = 0; d < kDim; ++d) out[d] /= sum;
  if (lse) *lse = shift + std::log(sum);
}

}  // namespace

void masked_attention(const double* q, const double* k, const double* v, const std::uint8_t* mask,
                      std::int64_t nq, std::int64_t nk, double scale, double* out, double* lse) {
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::uint8_t* row = mask + i * nk;  // [nk]
    attend_row(q + i * kDim, k, v, nk, scale, [row](std::int64_t j) { return row[j] != 0; },
               out + i * kDim, lse ? lse + i : nullptr);
  }
}

void causal_attention(const double* q, const double* k, const double* v, std::int64_t nq,
                      std::int64_t nk, std::int64_t first_pos, double scale, double* out,
                      double* lse) {
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t p = first_pos + i;
    attend_row(q + i * kDim, k, v, nk, scale, [p](std::int64_t j) { return j <= p; },
               out + i * kDim, lse ? lse + i : nullptr);
  }
}

}  // namespace msa::ref
