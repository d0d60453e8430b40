// Device helpers shared by the context-parallel kernels: the score order key,
// the owned columns of a row, and warp ballots.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "msa/context_parallel.hpp"

namespace msa::cuda::cp::detail {

// Warps per CTA of the row kernels (one warp per row).
inline constexpr int kWarps = 4;

// Order-preserving key of a score under select::ranks_before, ids aside:
// a ranks before b iff key(a) > key(b). NaN maps to 0, below every number
// (-inf maps to 0x007FFFFF); -0 and +0 map to the same key.
__device__ __forceinline__ std::uint32_t order_key(float f) {
  if (f != f) return 0u;
  std::uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Bit mask of the lanes below `lane`.
__device__ __forceinline__ std::uint32_t lanes_below(int lane) { return (1u << lane) - 1u; }

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
