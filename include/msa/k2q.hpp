// The key-major inversion of the top-k lists (contract 7, "k2q").
//
// For each KV head h and each (request r, logical block b), a row lists in
// ascending order the query tokens that selected b, and for each such edge its
// slot: the column k of topk[t, h, k]. Rows are numbered
//   row = h * num_rows + row_start[r] + b,  num_rows = row_start[num_requests],
// with row_start[r] the cumulative ceil(seq_len / 128) of the earlier requests.
#pragma once

#include <cstdint>
#include <vector>

#include "msa/batch.hpp"
#include "msa/ops.hpp"

namespace msa {

struct K2QPlan {
  std::int32_t num_kv_heads = 0;
  std::int32_t topk = 0;
  std::int64_t num_rows = 0;              // rows per KV head
  std::vector<std::int64_t> row_start;    // [num_requests + 1]
  std::vector<std::int64_t> offsets;      // [num_kv_heads * num_rows + 1] CSR offsets
  std::vector<std::int32_t> tokens;       // [nnz] query token ids, ascending per row
  std::vector<std::int32_t> slots;        // [nnz] column k of the edge in topk[t, h, :]
  std::vector<std::int32_t> counts;       // [num_tokens, num_kv_heads] valid entries per query
};

// Inverts topk for tokens [token_begin, token_end) (all tokens by default).
// Checks every entry: ids must be -1 or eligible for the token (<= p / 128 and
// < the request's blocks), valid entries first, no duplicates.
K2QPlan build_k2q(const StepView& step, const TopkView& topk, int num_kv_heads,
                  std::int32_t token_begin = 0, std::int32_t token_end = -1);

}  // namespace msa
