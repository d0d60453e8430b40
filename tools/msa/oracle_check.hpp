// The check of one step's results against the float64 oracle, on sampled rows.
//
// Attention: for each sampled token and KV head, dense K/V of the request are
// read back from the cache (tests/support/cache_reader.hpp), the mask is the
// contract's key set built from the step's top-k lists, and the oracle
// (tests/support/oracle.hpp) computes out and lse in float64.
//
// Index: the block scores of the sampled rows are recomputed in float64 from the
// dequantized index cache and the index query the engine read (e4m3 when the
// fp8 index query is used); every selected block that is not forced must score
// at least as high as every eligible block that was left out (up to fp32 rounding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.hpp"

namespace msa::tool {

struct Tolerance {
  double out_rel = 1e-2;  // relative Frobenius error of a row's output, all its query heads
  double lse_abs = 1e-3;  // absolute lse error
  // A selected block may score below a left-out one by at most
  // index_gap_abs + index_gap_rel * |score| (the engine's fp32 score error).
  double index_gap_abs = 1e-3;
  double index_gap_rel = 1e-4;
};

// Contract 9: 1e-2, or 2e-2 where a backend does fp8 arithmetic inside the kernel.
Tolerance contract_tolerance(bool fp8_arithmetic);

struct CheckResult {
  Tolerance tol;
  std::vector<std::int32_t> rows;  // sampled tokens
  double max_out_rel = 0.0;        // over the sampled rows
  std::int32_t worst_out_row = -1;
  double max_lse_abs = 0.0;
  std::int32_t worst_lse_row = -1;
  std::int64_t nonfinite_mismatches = 0;
  std::string out_problem;  // describe() of the first row out of bounds, if any
  std::string lse_problem;
  std::int64_t index_rows = 0;  // (token, KV head) rows whose selection was checked
  std::int64_t index_bad_rows = 0;
  double index_worst_gap = 0.0;  // largest (left-out score - selected score), 0 if none
  std::string index_problem;     // the first bad selection, in words

  bool out_ok() const {
    return nonfinite_mismatches == 0 && out_problem.empty() && max_out_rel <= tol.out_rel;
  }
  bool lse_ok() const { return lse_problem.empty() && max_lse_abs <= tol.lse_abs; }
  bool index_ok() const { return index_bad_rows == 0; }
  bool passed() const { return out_ok() && lse_ok() && index_ok(); }
};

// Rows to check: every decode token (at most `decode_rows`, spread evenly), and
// per prefill request its first and last two tokens plus evenly spread ones, up
// to `prefill_rows` in all. Ascending, no duplicates.
std::vector<std::int32_t> sample_rows(const BatchMetadata& meta, int decode_rows, int prefill_rows);

// Checks the host results in w.topk, w.out, w.lse on the given rows.
CheckResult check_rows(Workload& w, const std::vector<std::int32_t>& rows, const Tolerance& tol);

}  // namespace msa::tool
