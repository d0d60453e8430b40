// Host-side argument checks of the context-parallel entry points; each throws
// msa::Error naming the function, the argument and its value.
#pragma once

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/cuda_cp.hpp"

namespace msa::cuda::cp::detail {

// num_ranks >= 1, run_blocks >= 0, rank in [0, num_ranks).
void check_sharding(const char* fn, const Sharding& sharding, std::int32_t rank);
// The step's shape and the selection numbers (the indexer's rules).
void check_select(const char* fn, const StepView& step, const SelectShape& shape);

}  // namespace msa::cuda::cp::detail
