// Internal launchers of the CUDA indexer: the block-score kernel (scores.cu)
// and the top-k selection kernel (select.cu). indexer.cu holds the public entry
// points and the host-side checks.
//
// Rows: the indexer works on rows row = t * num_kv_heads + h (one per query
// token and KV head); the index queries [num_tokens, H, 128] and the scores
// [num_tokens, H, max_blocks] are both row-major over these rows.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "msa/batch.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::indexer {

// Scores of rows [row_begin, row_end): for each row and each block b <= the
// row's last block (p / 128, capped at block_limit - 1), the NaN-lowest max
// over the visible keys of dot(index_q, index_k); -inf for b beyond the row's
// last block up to the tile's last block. Columns the launch does not reach are
// left for the selection kernel's tail fill.
//   scores: [num_tokens, num_kv_heads, max_blocks]
//   check:  [8] DeviceCheck buffer or null
void launch_block_scores(const StepView& step, const IndexerArgs& args, float* scores,
                         std::int32_t max_blocks, std::int32_t block_limit, std::int64_t row_begin,
                         std::int64_t row_end, std::int64_t* check, cudaStream_t stream);

// Top-k of every row from its scores (msa/select.hpp order, bit-identical to
// cpu::select_row). When `fill` is not null, fill[row, b] = -inf for the
// columns b beyond the row's last block (fill may alias scores).
//   scores: [num_tokens, num_kv_heads, max_blocks]
//   fill:   [num_tokens, num_kv_heads, max_blocks] or null
void launch_select(const StepView& step, const float* scores, float* fill, std::int32_t max_blocks,
                   std::int32_t block_limit, std::int32_t num_kv_heads, const TopkView& out,
                   std::int32_t init_blocks, std::int32_t local_blocks, cudaStream_t stream);

}  // namespace msa::cuda::indexer
