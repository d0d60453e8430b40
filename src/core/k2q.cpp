// The key-major inversion of the top-k lists (contract 7, "k2q"): a counting
// sort of the valid (token, head, slot) entries by (head, request, block).
// Two passes over the lists, linear in their size; tokens are visited in
// ascending order, so every row comes out ascending and the plan is
// deterministic.
#include "msa/k2q.hpp"

#include <cstdint>
#include <vector>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa {

K2QPlan build_k2q(const StepView& step, const TopkView& topk, int num_kv_heads,
                  std::int32_t token_begin, std::int32_t token_end) {
  if (token_end < 0) token_end = step.num_tokens;
  check::topk_data(step, topk, num_kv_heads, token_begin, token_end);

  K2QPlan plan;
  plan.num_kv_heads = num_kv_heads;
  plan.topk = topk.topk;
  plan.row_start.assign(std::size_t(step.num_requests) + 1, 0);
  for (std::int32_t r = 0; r < step.num_requests; ++r) {
    plan.row_start[r + 1] =
        plan.row_start[r] + (std::int64_t(step.seq_lens[r]) + kBlockSize - 1) / kBlockSize;
  }
  plan.num_rows = plan.row_start[step.num_requests];
  const std::int64_t total_rows = plan.num_rows * num_kv_heads;
  plan.counts.assign(std::size_t(step.num_tokens) * num_kv_heads, 0);

  // Row of the valid entry id of token t (request r), head h.
  const auto row_of = [&](std::int32_t h, std::int32_t r, std::int32_t id) {
    return h * plan.num_rows + plan.row_start[r] + id;
  };

  // Pass 1: edges per row, then exclusive prefix sums.
  plan.offsets.assign(std::size_t(total_rows) + 1, 0);
  for (std::int32_t t = token_begin; t < token_end; ++t) {
    const std::int32_t r = step.token_request[t];
    for (std::int32_t h = 0; h < num_kv_heads; ++h) {
      const std::int32_t* ids = topk.row(t, h);  // [topk]
      std::int32_t valid = 0;
      while (valid < topk.topk && ids[valid] >= 0) {
        ++plan.offsets[row_of(h, r, ids[valid]) + 1];
        ++valid;
      }
      plan.counts[std::size_t(t) * num_kv_heads + h] = valid;
    }
  }
  for (std::int64_t i = 0; i < total_rows; ++i) plan.offsets[i + 1] += plan.offsets[i];
  const std::int64_t nnz = plan.offsets[total_rows];

  // Pass 2: place the edges; `fill` is the next free position of each row.
  plan.tokens.resize(nnz);
  plan.slots.resize(nnz);
  std::vector<std::int64_t> fill(plan.offsets.begin(), plan.offsets.end() - 1);
  for (std::int32_t t = token_begin; t < token_end; ++t) {
    const std::int32_t r = step.token_request[t];
    for (std::int32_t h = 0; h < num_kv_heads; ++h) {
      const std::int32_t* ids = topk.row(t, h);  // [topk]
      const std::int32_t valid = plan.counts[std::size_t(t) * num_kv_heads + h];
      for (std::int32_t k = 0; k < valid; ++k) {
        const std::int64_t at = fill[row_of(h, r, ids[k])]++;
        plan.tokens[at] = t;
        plan.slots[at] = k;
      }
    }
  }
  return plan;
}

}  // namespace msa
