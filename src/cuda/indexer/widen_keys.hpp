// nvfp4 index keys of a step's prefill requests widened once into the
// workspace (widen_keys.cu), so that the prefill score kernel multiplies them
// as 16-bit keys read by tensor loads instead of widening each page in every
// tile that scores it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::indexer {

// Bytes of one widened block: 128 keys x 128 features of 16 bits.
inline constexpr std::int64_t kWidenedBlockBytes = std::int64_t(kBlockSize) * kHeadDim * 2;

// Slot of block b of prefill request r (num_decodes <= r < num_requests).
__host__ __device__ inline std::int64_t widened_slot(const StepView& step, std::int32_t block_limit,
                                                     std::int32_t r, std::int32_t b) {
  return std::int64_t(r - step.num_decodes) * block_limit + b;
}

// Widens blocks 0 .. min(ceil(seq_len / 128), block_limit) - 1 of every prefill
// request from the nvfp4 index cache into `widened`: e2m1 code x e4m3 group
// scale, exact in bf16 and in fp16 (f16: fp16, for fp16 queries); the global
// scale is left to the scores. Blocks whose table entry lies outside the cache
// are left as they are (the score kernel records them and scores them NaN).
//   widened: [(num_requests - num_decodes) * block_limit][128 keys][128] bf16 / fp16
void launch_widen_keys(const StepView& step, const IndexerArgs& args, bool f16, void* widened,
                       std::int32_t block_limit, cudaStream_t stream);

}  // namespace msa::cuda::indexer
