// Comparison of computed arrays against the float64 oracle, with a message
// that names the worst element. Every element counts: a non-finite value must
// sit exactly where the reference has the same non-finite value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace msa::ref {

struct Comparison {
  std::int64_t count = 0;          // elements compared
  // ||got - want|| / ||want|| over finite pairs (||got - want|| when want is 0);
  // compare_rows: the largest of the rows' values, the row in worst_row.
  double rel_frobenius = 0.0;
  std::int64_t worst_row = -1;     // compare_rows only
  double max_abs = 0.0;            // largest |got - want| over finite pairs
  std::int64_t worst = -1;         // index of max_abs (-1: none)
  double worst_got = 0.0, worst_want = 0.0;
  std::int64_t mismatches = 0;     // non-finite placement errors (NaN, +-inf)
  std::int64_t first_mismatch = -1;
  double mismatch_got = 0.0, mismatch_want = 0.0;
  std::string what = "values";     // name used in describe()

  // Output check: no placement error and rel_frobenius <= tol.
  bool rel_ok(double tol) const { return mismatches == 0 && rel_frobenius <= tol; }
  // lse check: no placement error and max_abs <= tol.
  bool abs_ok(double tol) const { return mismatches == 0 && max_abs <= tol; }
  // e.g. "out: 4096 elements, rel_frobenius 3.1e-03, max_abs 2.0e-02 at [517] got 1.25 want 1.27;
  //       2 non-finite mismatches, first at [9] got nan want 0.5"
  std::string describe() const;
};

// Values (outputs): NaN in want needs NaN in got, +-inf needs the same inf;
// any non-finite got where want is finite is a mismatch.
//   got, want: [n]
Comparison compare(const double* got, const double* want, std::int64_t n,
                   const std::string& what = "out");
Comparison compare(const std::vector<double>& got, const std::vector<double>& want,
                   const std::string& what = "out");

// Outputs as the contract bounds them: row by row, a row being `row_len`
// elements (one token's [num_q_heads, 128] output). rel_frobenius is the worst
// row's relative Frobenius error; the other fields are those of compare() over
// all elements.
//   got, want: [n / row_len, row_len]
Comparison compare_rows(const double* got, const double* want, std::int64_t n, std::int64_t row_len,
                        const std::string& what = "out");
Comparison compare_rows(const std::vector<double>& got, const std::vector<double>& want,
                        std::int64_t row_len, const std::string& what = "out");

// Log-sum-exp values: as compare(), and -inf (an empty row) must match -inf
// exactly. Judge with abs_ok(tol).
//   got, want: [n]
Comparison compare_lse(const double* got, const double* want, std::int64_t n,
                       const std::string& what = "lse");
Comparison compare_lse(const std::vector<double>& got, const std::vector<double>& want,
                       const std::string& what = "lse");

}  // namespace msa::ref
