#include "compare.hpp"

#include <cmath>
#include <sstream>

#include "msa/error.hpp"

namespace msa::ref {

namespace {

// Same non-finite class: both NaN, or both the same infinity.
bool same_nonfinite(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want;  // want is +-inf here
}

}  // namespace

std::string Comparison::describe() const {
  std::ostringstream os;
  os.precision(6);
  os << what << ": " << count << " elements, rel_frobenius " << std::scientific << rel_frobenius
     << ", max_abs " << max_abs << std::defaultfloat;
  if (worst_row >= 0) os << " (worst row " << worst_row << ")";
  if (worst >= 0) os << " at [" << worst << "] got " << worst_got << " want " << worst_want;
  if (mismatches > 0) {
    os << "; " << mismatches << " non-finite mismatches, first at [" << first_mismatch << "] got "
       << mismatch_got << " want " << mismatch_want;
  }
  return os.str();
}

Comparison compare(const double* got, const double* want, std::int64_t n, const std::string& what) {
  Comparison c;
  c.what = what;
  c.count = n;
  double diff2 = 0.0, want2 = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    const bool finite_pair = std::isfinite(g) && std::isfinite(w);
    if (!finite_pair) {
      if (std::isfinite(w) || !same_nonfinite(g, w)) {
        if (c.mismatches++ == 0) {
          c.first_mismatch = i;
          c.mismatch_got = g;
          c.mismatch_want = w;
        }
      }
      continue;
    }
    const double d = std::fabs(g - w);
    diff2 += d * d;
    want2 += w * w;
    if (c.worst < 0 || d > c.max_abs) {
      c.max_abs = d;
      c.worst = i;
      c.worst_got = g;
      c.worst_want = w;
    }
  }
  c.rel_frobenius = want2 > 0.0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
  return c;
}

Comparison compare(const std::vector<double>& got, const std::vector<double>& want,
                   const std::string& what) {
  MSA_CHECK(got.size() == want.size(), what, ": got has ", got.size(), " elements but want has ",
            want.size());
  return compare(got.data(), want.data(), std::int64_t(got.size()), what);
}

Comparison compare_rows(const double* got, const double* want, std::int64_t n, std::int64_t row_len,
                        const std::string& what) {
  MSA_CHECK(row_len > 0 && n % row_len == 0, what, ": ", n, " elements are not whole rows of ", row_len);
  Comparison c = compare(got, want, n, what);
  c.rel_frobenius = 0.0;
  for (std::int64_t r = 0; r * row_len < n; ++r) {
    const double e = compare(got + r * row_len, want + r * row_len, row_len, what).rel_frobenius;
    if (c.worst_row < 0 || e > c.rel_frobenius) {
      c.rel_frobenius = e;
      c.worst_row = r;
    }
  }
  return c;
}

Comparison compare_rows(const std::vector<double>& got, const std::vector<double>& want,
                        std::int64_t row_len, const std::string& what) {
  MSA_CHECK(got.size() == want.size(), what, ": got has ", got.size(), " elements but want has ",
            want.size());
  return compare_rows(got.data(), want.data(), std::int64_t(got.size()), row_len, what);
}

Comparison compare_lse(const double* got, const double* want, std::int64_t n,
                       const std::string& what) {
  // The rules of compare() already demand -inf exactly where want is -inf and
  // flag a -inf got against a finite want.
  return compare(got, want, n, what);
}

Comparison compare_lse(const std::vector<double>& got, const std::vector<double>& want,
                       const std::string& what) {
  MSA_CHECK(got.size() == want.size(), what, ": got has ", got.size(), " elements but want has ",
            want.size());
  return compare_lse(got.data(), want.data(), std::int64_t(got.size()), what);
}

}  // namespace msa::ref
