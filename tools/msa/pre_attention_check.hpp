// `msa run`'s check of the pre-attention stage against the float64 oracle
// (tests/support/pre_attention_ref.hpp): norm + RoPE of every head of every
// token in float64, rounded to the source dtype, stored as the SEMANTICS of
// msa/pre_attention.hpp say (q and index q in their dtypes; K, V and index
// keys through cpu::insert_kv / insert_index into scratch caches of the
// workload's dtypes), then compared as values with what the step wrote. The
// two differ only where fp32 and float64 round a value differently, one step
// of the stored format on a few elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qkv_step.hpp"
#include "workload.hpp"

namespace msa::tool {

struct PreAttentionCheck {
  struct Output {
    std::string name;         // q, index q, K, V, index keys
    std::int64_t values = 0;
    std::int64_t differ = 0;  // values that are not the oracle's
    double rel = 0.0;         // relative Frobenius error
  };
  std::int64_t tokens = 0;
  double bound = 1e-2;  // contract 9's bound for 16-bit arithmetic
  std::vector<Output> outputs;
  std::string problem;  // the first output out of bounds, in words

  bool passed() const { return problem.empty(); }
  // The output with the largest error.
  const Output* worst() const;
};

// Checks the workload's q, index_q and caches after the step's pre-attention.
PreAttentionCheck check_pre_attention(Workload& w, const QkvStep& step);

}  // namespace msa::tool
