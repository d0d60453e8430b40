// Checks of the top-k block lists (contract 5 and 8).
#include <algorithm>
#include <array>
#include <cstdint>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

// One row topk[t, h, :] of token t of request r at position p. A padding row
// (p < 0) belongs to a request of 0 blocks, so it may only hold -1.
void topk_row(const TopkView& topk, std::int32_t t, std::int32_t h, std::int32_t r, std::int32_t p,
              std::int64_t request_blocks) {
  const std::int32_t* row = topk.row(t, h);  // [topk]
  std::array<std::int32_t, kMaxTopk> ids{};
  int num_valid = 0;
  int first_empty = -1;  // column of the first -1
  for (int k = 0; k < topk.topk; ++k) {
    const std::int32_t id = row[k];
    if (id == -1) {
      if (first_empty < 0) first_empty = k;
      continue;
    }
    MSA_CHECK(id >= 0, "topk[t=", t, ", h=", h, ", k=", k, "] = ", id,
              " is neither -1 nor a block id");
    MSA_CHECK(first_empty < 0, "topk[t=", t, ", h=", h, ", k=", k, "] = ", id, " follows a -1 at k=",
              first_empty, " (valid entries must come first)");
    MSA_CHECK(id < request_blocks, "topk[t=", t, ", h=", h, ", k=", k, "] = ", id, " but request ",
              r, " has ", request_blocks, " blocks");
    MSA_CHECK(id <= p / kBlockSize, "topk[t=", t, ", h=", h, ", k=", k, "] = ", id,
              " but the token's position ", p, " allows blocks 0..", p / kBlockSize);
    ids[num_valid++] = id;
  }
  std::sort(ids.begin(), ids.begin() + num_valid);
  const auto dup = std::adjacent_find(ids.begin(), ids.begin() + num_valid);
  if (dup == ids.begin() + num_valid) return;
  int first = -1;
  for (int k = 0; k < topk.topk; ++k) {
    if (row[k] != *dup) continue;
    if (first >= 0) {
      fail("topk[t=", t, ", h=", h, ", k=", k, "] = ", row[k], " repeats topk[t=", t, ", h=", h,
           ", k=", first, "]");
    }
    first = k;
  }
}

}  // namespace

void topk_data(const StepView& step, const TopkView& topk, int num_kv_heads,
               std::int32_t token_begin, std::int32_t token_end) {
  step_data(step);
  if (token_end < 0) token_end = step.num_tokens;
  MSA_CHECK(num_kv_heads >= 1, "num_kv_heads = ", num_kv_heads, " must be >= 1");
  MSA_CHECK(topk.topk >= 1 && topk.topk <= kMaxTopk, "topk.topk = ", topk.topk, " must be in [1, ",
            kMaxTopk, "]");
  MSA_CHECK(token_begin >= 0 && token_begin <= token_end && token_end <= step.num_tokens,
            "top-k token range [", token_begin, ", ", token_end, ") is not inside [0, num_tokens = ",
            step.num_tokens, "]");
  if (token_begin == token_end) return;
  topk_view(topk, step.num_tokens, num_kv_heads, "topk");
  for (std::int32_t t = token_begin; t < token_end; ++t) {
    const std::int32_t r = step.token_request[t];
    const std::int32_t p = step.position(t, r);
    const std::int64_t request_blocks =
        (std::int64_t(step.seq_lens[r]) + kBlockSize - 1) / kBlockSize;
    for (std::int32_t h = 0; h < num_kv_heads; ++h) topk_row(topk, t, h, r, p, request_blocks);
  }
}

}  // namespace msa::check
