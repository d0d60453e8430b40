// Comparisons used by `msa check`: pure host functions on plain arrays, so
// their NaN and infinity rules are unit-tested on the CPU.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace msa::tool {

// Result of one comparison: the error measure and the worst element.
struct Diff {
  double error = 0.0;       // the measure (see each function)
  std::int64_t worst = -1;  // index of the worst element, -1 if none
  double got = 0.0;         // value of the worst element in the result under test
  double want = 0.0;        // and in the reference
  std::int64_t count = 0;   // elements that differ at all
};

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// ||got - want||_F / ||want||_F. Elements that are equal (including equal
// infinities) add nothing; a NaN in `got`, or an infinity where `want` differs,
// makes the error infinite. 0 when both are all zero.
inline Diff rel_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  Diff d;
  double num = 0.0, den = 0.0, worst_abs = -1.0;
  const std::size_t n = got.size() < want.size() ? got.size() : want.size();
  if (got.size() != want.size()) d.error = kInf;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (std::isfinite(w)) den += w * w;
    if (g == w) continue;
    ++d.count;
    const double e = (std::isfinite(g) && std::isfinite(w)) ? std::fabs(g - w) : kInf;
    if (e > worst_abs) {
      worst_abs = e;
      d.worst = std::int64_t(i);
      d.got = g;
      d.want = w;
    }
    if (e == kInf) d.error = kInf;
    else num += e * e;
  }
  if (d.error != kInf) d.error = num == 0.0 ? 0.0 : (den > 0.0 ? std::sqrt(num / den) : kInf);
  return d;
}

// rel_frobenius row by row, as the contract bounds outputs: rows of `row_len`
// elements (one token's [num_q_heads, 128] output); the error is the worst
// row's, `worst` its worst element, `count` the differing elements of all rows.
inline Diff rel_frobenius_rows(const std::vector<float>& got, const std::vector<float>& want,
                               std::size_t row_len) {
  Diff d;
  if (got.size() != want.size() || row_len == 0 || got.size() % row_len != 0) {
    d.error = kInf;
    return d;
  }
  for (std::size_t r = 0; r < got.size(); r += row_len) {
    const std::vector<float> g(got.begin() + r, got.begin() + r + row_len);
    const std::vector<float> w(want.begin() + r, want.begin() + r + row_len);
    Diff e = rel_frobenius(g, w);
    const std::int64_t count = d.count + e.count;
    if (e.worst >= 0 && (d.worst < 0 || e.error > d.error)) {
      d = e;
      d.worst += std::int64_t(r);
    }
    d.count = count;
  }
  return d;
}

// The largest elementwise error `err(got, want)` over the entries that differ,
// with its index; equal values (including equal infinities) count 0, and a NaN
// or an infinity on either side of a differing pair counts +inf.
template <typename Err>
inline Diff worst_elementwise(const std::vector<float>& got, const std::vector<float>& want, Err err) {
  Diff d;
  const std::size_t n = got.size() < want.size() ? got.size() : want.size();
  if (got.size() != want.size()) d.error = kInf;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (g == w) continue;
    ++d.count;
    const double e = (std::isfinite(g) && std::isfinite(w)) ? err(g, w) : kInf;
    if (e > d.error || d.worst < 0) {
      if (e > d.error) d.error = e;
      d.worst = std::int64_t(i);
      d.got = g;
      d.want = w;
    }
  }
  return d;
}

// max |got - want|.
inline Diff max_abs(const std::vector<float>& got, const std::vector<float>& want) {
  return worst_elementwise(got, want, [](double g, double w) { return std::fabs(g - w); });
}

// max |got - want| / (1 + |want|) over the entries where `want` is finite;
// where `want` is -inf (a block the query may not see) `got` must be -inf too.
inline Diff score_error(const std::vector<float>& got, const std::vector<float>& want) {
  return worst_elementwise(got, want,
                           [](double g, double w) { return std::fabs(g - w) / (1.0 + std::fabs(w)); });
}

// Bytes that differ; error = their count, worst = the first one.
inline Diff byte_mismatch(const std::uint8_t* got, const std::uint8_t* want, std::size_t n) {
  Diff d;
  for (std::size_t i = 0; i < n; ++i) {
    if (got[i] == want[i]) continue;
    if (d.worst < 0) {
      d.worst = std::int64_t(i);
      d.got = got[i];
      d.want = want[i];
    }
    ++d.count;
  }
  d.error = double(d.count);
  return d;
}

}  // namespace msa::tool
