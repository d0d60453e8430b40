// The query rows of a token tile: rows token-major (row = t * G + g), each as
// 16 chunks of 8 elements converted to the MMA type; rows of tokens past the
// tile are zero. Shared by the mma.sync and wgmma token-tile kernels, which
// store the chunks in their own shared-memory layouts.
#pragma once

#include <cstdint>

#include "cuda/attention/shared/query.cuh"
#include "cuda/attention/shared/tile_scheduler.cuh"

namespace msa::cuda::attention {

// Chunk c (elements 8c .. 8c + 7) of tile row `row`.
//   p.q: [num_tokens, num_q_heads, 128]
template <bool kF16>
__device__ __forceinline__ uint4 tile_query_chunk(const AttendParams& p, const TileWork& t, int row, int c) {
  const int tok = row / p.group, g = row - tok * p.group;
  if (tok >= t.count) return make_uint4(0, 0, 0, 0);
  const std::int64_t qh = std::int64_t(t.head) * p.group + g;
  return load_query_chunk<kF16>(p, (std::int64_t(t.first + tok) * p.num_q_heads + qh) * kDim + 8 * c);
}

}  // namespace msa::cuda::attention
