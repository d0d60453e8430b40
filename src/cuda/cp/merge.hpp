// The merge of context parallelism as the layer runs it: the global top-k and
// this rank's entries of it in one pass (merge_candidates then owned_entries
// in one kernel).
#pragma once

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::cp::detail {

// merge_candidates into `out`; with owned.data set, also owned_entries(out, rank)
// into `owned` (not `out`).
//   candidates: [num_ranks, num_tokens, num_kv_heads, topk]
//   out, owned: [num_tokens, num_kv_heads, topk] (any strides)
void merge_and_own(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                   std::int32_t rank, const Candidate* candidates, const TopkView& out,
                   const TopkView& owned, Stream stream);

}  // namespace msa::cuda::cp::detail
