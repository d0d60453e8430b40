#include "cuda/cp/cp_checks.hpp"

#include "core/checks.hpp"
#include "msa/common.hpp"
#include "msa/error.hpp"

namespace msa::cuda::cp::detail {

void check_sharding(const char* fn, const Sharding& sharding, std::int32_t rank) {
  MSA_CHECK(sharding.num_ranks >= 1, fn, ": sharding.num_ranks = ", sharding.num_ranks,
            " must be >= 1");
  MSA_CHECK(sharding.run_blocks >= 0, fn, ": sharding.run_blocks = ", sharding.run_blocks,
            " must be >= 0 (0 = round-robin)");
  MSA_CHECK(rank >= 0 && rank < sharding.num_ranks, fn, ": rank = ", rank, " is not in [0, ",
            sharding.num_ranks, ")");
}

void check_select(const char* fn, const StepView& step, const SelectShape& shape) {
  check::step_shape(step);
  MSA_CHECK(shape.num_kv_heads >= 1, fn, ": num_kv_heads = ", shape.num_kv_heads,
            " but at least 1 is needed");
  MSA_CHECK(shape.topk >= 1 && shape.topk <= kMaxTopk, fn, ": topk = ", shape.topk,
            " is outside [1, ", kMaxTopk, "]");
  MSA_CHECK(shape.init_blocks >= 0 && shape.local_blocks >= 0, fn, ": init_blocks = ",
            shape.init_blocks, ", local_blocks = ", shape.local_blocks, " must not be negative");
  MSA_CHECK(std::int64_t(shape.init_blocks) + shape.local_blocks <= shape.topk, fn,
            ": init_blocks + local_blocks = ", shape.init_blocks, " + ", shape.local_blocks,
            " exceeds topk = ", shape.topk);
  MSA_CHECK(shape.max_blocks >= 0, fn, ": max_blocks = ", shape.max_blocks, " is negative");
}

}  // namespace msa::cuda::cp::detail
