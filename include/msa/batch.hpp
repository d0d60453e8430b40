// Batch metadata of one engine step (contract 7), computed once per step and
// shared by every sparse layer.
#pragma once

#include <cstdint>
#include <vector>

#include "msa/common.hpp"

namespace msa {

// What the engine knows about the step, per request in batch order.
struct BatchSpec {
  std::vector<std::int32_t> query_lens;  // [num_requests] new tokens this step
  std::vector<std::int32_t> seq_lens;    // [num_requests] cached + new tokens (0 = padding request)
  // Requests with 0 < query_len <= decode_threshold are decodes (1, or
  // 1 + number of speculative draft tokens). They must come first.
  std::int32_t decode_threshold = 1;
};

// The step as the kernels see it. Pointers live in the memory of the backend
// that runs the step (host for the CPU engine, device for CUDA).
struct StepView {
  std::int32_t num_requests = 0;
  std::int32_t num_tokens = 0;
  std::int32_t num_decodes = 0;
  std::int32_t num_decode_tokens = 0;
  std::int32_t decode_query_len = 0;
  const std::int32_t* query_start = nullptr;    // [num_requests + 1] first token of each request
  const std::int32_t* seq_lens = nullptr;       // [num_requests]
  const std::int32_t* token_request = nullptr;  // [num_tokens] request of each token

  // Absolute position of token t of request r: seq_len - query_len + i. Negative
  // only for the rows of a padding request (seq_len 0), which attend nothing.
  MSA_HD std::int32_t position(std::int32_t t, std::int32_t r) const {
    const std::int32_t qlen = query_start[r + 1] - query_start[r];
    if (seq_lens[r] <= 0) return -1;
    return seq_lens[r] - qlen + (t - query_start[r]);
  }
  MSA_HD std::int32_t position(std::int32_t t) const { return position(t, token_request[t]); }
};

// Host-side metadata, derived and validated from a BatchSpec.
struct BatchMetadata {
  std::int32_t num_requests = 0;
  std::int32_t num_tokens = 0;
  std::int32_t num_decodes = 0;
  std::int32_t num_decode_tokens = 0;
  std::int32_t decode_query_len = 0;  // uniform over the decodes; 0 without decodes
  std::int32_t num_prefills = 0;
  std::int32_t num_prefill_tokens = 0;

  std::vector<std::int32_t> query_start;     // [num_requests + 1]
  std::vector<std::int32_t> seq_lens;        // [num_requests]
  std::vector<std::int32_t> context_lens;    // [num_requests] seq_len - query_len (0 for padding)
  std::vector<std::int32_t> token_request;   // [num_tokens]
  std::vector<std::int32_t> token_position;  // [num_tokens] absolute position, -1 for padding rows

  // Prefill part (requests num_decodes..num_requests-1), as the prefill kernels want it.
  std::vector<std::int32_t> cu_seqlens_q;          // [num_prefills + 1] rebased to 0
  std::vector<std::int32_t> cu_seqlens_k;          // [num_prefills + 1] cumulative seq_lens
  std::vector<std::int32_t> prefill_seq_lens;      // [num_prefills]
  std::vector<std::int32_t> prefill_context_lens;  // [num_prefills]
  std::int32_t max_query_len = 0;                  // over prefills
  std::int32_t max_seq_len = 0;                    // over prefills
  std::int64_t total_kv_blocks = 0;                // sum over prefills of ceil(seq_len / 128)

  // Blocks of request r: ceil(seq_len / 128).
  std::int32_t num_blocks(std::int32_t r) const { return (seq_lens[r] + kBlockSize - 1) / kBlockSize; }
  // A view whose pointers are these host vectors.
  StepView view() const;
};

// Derives and validates the metadata; throws msa::Error naming the request and
// value on: negative lengths, 0 < seq_len < query_len, a decode after a prefill,
// decodes of different query lengths, token counts beyond int32.
BatchMetadata build_metadata(const BatchSpec& spec);

}  // namespace msa
