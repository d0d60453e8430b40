// Checks of a StepView (contract 7) and of the block-table entries it needs.
#include <cstdint>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

void step_shape(const StepView& step) {
  MSA_CHECK(step.num_requests >= 0, "step.num_requests = ", step.num_requests, " is negative");
  MSA_CHECK(step.num_tokens >= 0, "step.num_tokens = ", step.num_tokens, " is negative");
  MSA_CHECK(step.num_decodes >= 0 && step.num_decodes <= step.num_requests, "step.num_decodes = ",
            step.num_decodes, " is not in [0, num_requests = ", step.num_requests, "]");
  MSA_CHECK(step.decode_query_len >= 0, "step.decode_query_len = ", step.decode_query_len,
            " is negative");
  MSA_CHECK(step.num_decodes == 0 || step.decode_query_len >= 1, "step.decode_query_len = ",
            step.decode_query_len, " but the step has ", step.num_decodes, " decodes");
  const std::int64_t decode_tokens = std::int64_t(step.num_decodes) * step.decode_query_len;
  MSA_CHECK(step.num_decode_tokens == decode_tokens, "step.num_decode_tokens = ",
            step.num_decode_tokens, " but num_decodes * decode_query_len = ", step.num_decodes,
            " * ", step.decode_query_len, " = ", decode_tokens);
  MSA_CHECK(step.num_decode_tokens <= step.num_tokens, "step.num_decode_tokens = ",
            step.num_decode_tokens, " exceeds num_tokens = ", step.num_tokens);
  MSA_CHECK(step.query_start != nullptr, "step.query_start is null");
  MSA_CHECK(step.num_requests == 0 || step.seq_lens != nullptr, "step.seq_lens is null but the step has ",
            step.num_requests, " requests");
  MSA_CHECK(step.num_tokens == 0 || step.token_request != nullptr,
            "step.token_request is null but the step has ", step.num_tokens, " tokens");
  aligned("step.query_start", step.query_start, sizeof(std::int32_t), "int32 entries");
  aligned("step.seq_lens", step.seq_lens, sizeof(std::int32_t), "int32 entries");
  aligned("step.token_request", step.token_request, sizeof(std::int32_t), "int32 entries");
}

void step_data(const StepView& step) {
  step_shape(step);
  const std::int32_t* qs = step.query_start;  // [num_requests + 1]
  MSA_CHECK(qs[0] == 0, "step.query_start[0] = ", qs[0], " but must be 0");
  for (std::int32_t r = 0; r < step.num_requests; ++r) {
    MSA_CHECK(qs[r + 1] >= qs[r], "step.query_start[", r + 1, "] = ", qs[r + 1],
              " is below query_start[", r, "] = ", qs[r]);
    MSA_CHECK(qs[r + 1] <= step.num_tokens, "step.query_start[", r + 1, "] = ", qs[r + 1],
              " exceeds num_tokens = ", step.num_tokens);
  }
  MSA_CHECK(qs[step.num_requests] == step.num_tokens, "step.query_start[", step.num_requests,
            "] = ", qs[step.num_requests], " but num_tokens = ", step.num_tokens);
  MSA_CHECK(qs[step.num_decodes] == step.num_decode_tokens, "step.query_start[num_decodes = ",
            step.num_decodes, "] = ", qs[step.num_decodes], " but num_decode_tokens = ",
            step.num_decode_tokens);
  for (std::int32_t r = 0; r < step.num_requests; ++r) {
    const std::int32_t qlen = qs[r + 1] - qs[r];
    const std::int32_t slen = step.seq_lens[r];
    MSA_CHECK(slen >= 0, "step.seq_lens[", r, "] = ", slen, " is negative");
    MSA_CHECK(slen == 0 || slen >= qlen, "step.seq_lens[", r, "] = ", slen,
              " is below the request's query length ", qlen, " (0 marks a padding request)");
    MSA_CHECK(r >= step.num_decodes || qlen == step.decode_query_len, "decode request ", r,
              " has query length ", qlen, " but decode_query_len = ", step.decode_query_len);
    for (std::int32_t t = qs[r]; t < qs[r + 1]; ++t) {
      MSA_CHECK(step.token_request[t] == r, "step.token_request[", t, "] = ", step.token_request[t],
                " but query_start puts token ", t, " in request ", r);
    }
  }
}

void block_table_data(const StepView& step, const BlockTable& table, std::int64_t num_pages,
                      const char* what) {
  step_data(step);
  MSA_CHECK(num_pages >= 0, what, ": num_pages = ", num_pages, " is negative");
  block_table_view(table, step.num_requests, num_pages, what);
  for (std::int32_t r = 0; r < step.num_requests; ++r) {
    const std::int64_t blocks = (std::int64_t(step.seq_lens[r]) + kBlockSize - 1) / kBlockSize;
    MSA_CHECK(blocks <= table.max_blocks, what, ": request ", r, " has seq_len ", step.seq_lens[r],
              " and needs ", blocks, " blocks but the table has ", table.max_blocks, " columns");
    if (blocks == 0) continue;
    MSA_CHECK(table.data != nullptr, what, ".data is null but request ", r, " needs ", blocks,
              " blocks");
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int32_t page = table.at(r, b);
      MSA_CHECK(page >= 0, what, "[r=", r, ", b=", b, "] = ", page, " is negative");
      MSA_CHECK(page < num_pages, what, "[r=", r, ", b=", b, "] = ", page, " but the cache has ",
                num_pages, " pages");
    }
  }
}

}  // namespace msa::check
