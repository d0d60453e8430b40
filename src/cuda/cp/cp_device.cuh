// Helpers shared by the context-parallel row kernels: the numbers every row
// kernel of the selection reads, and the owned columns of a row. (The score
// order key and the warp ballots are in cuda/common/warp_select.cuh.)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/context_parallel.hpp"
#include "msa/cuda_cp.hpp"

namespace msa::cuda::cp::detail {

// Warps per CTA of the row kernels (one warp per row).
inline constexpr int kWarps = 4;

// The numbers of the selection rows (t, h), row = t * num_heads + h, as the
// candidate and merge kernels read them; their params structs extend it.
struct RowParams {
  StepView step;
  std::int32_t max_blocks = 0;
  std::int32_t num_heads = 0;
  std::int32_t topk = 0;
  std::int32_t init_blocks = 0;
  std::int32_t local_blocks = 0;
  msa::cp::Sharding sharding;
  std::int64_t num_rows = 0;
};

// The rows of a step under `shape` and `sharding`.
inline RowParams row_params(const StepView& step, const SelectShape& shape,
                            const msa::cp::Sharding& sharding) {
  return RowParams{.step = step,
                   .max_blocks = shape.max_blocks,
                   .num_heads = shape.num_kv_heads,
                   .topk = shape.topk,
                   .init_blocks = shape.init_blocks,
                   .local_blocks = shape.local_blocks,
                   .sharding = sharding,
                   .num_rows = std::int64_t(step.num_tokens) * shape.num_kv_heads};
}

// Blocks first + i * step, i in [0, count).
struct Progression {
  std::int32_t first = 0;
  std::int32_t step = 1;
  std::int32_t count = 0;
  __device__ __forceinline__ std::int32_t at(std::int32_t i) const { return first + i * step; }
};

// The blocks of [lo, hi] that `rank` owns: every num_ranks-th block under
// round-robin sharding, one contiguous run otherwise (the last rank's run
// reaches to the end). Either way an arithmetic progression.
__device__ __forceinline__ Progression owned_blocks(const msa::cp::Sharding& sh, std::int32_t rank,
                                                    std::int32_t lo, std::int32_t hi) {
  Progression g;
  std::int64_t first, step, end;
  if (sh.run_blocks <= 0) {
    first = rank;
    step = sh.num_ranks;
    end = hi;
  } else {
    first = std::int64_t(rank) * sh.run_blocks;
    step = 1;
    end = rank == sh.num_ranks - 1 ? std::int64_t(hi) : min(std::int64_t(hi), first + sh.run_blocks - 1);
  }
  const std::int64_t from = max(std::int64_t(lo), first);
  if (from > end) return g;
  const std::int64_t b0 = first + (from - first + step - 1) / step * step;
  if (b0 > end) return g;
  g.first = static_cast<std::int32_t>(b0);
  g.step = static_cast<std::int32_t>(step);
  g.count = static_cast<std::int32_t>((end - b0) / step + 1);
  return g;
}

}  // namespace msa::cuda::cp::detail
