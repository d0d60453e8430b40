// The decode / verify block-score kernel of the indexer (decode_scores.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::indexer {

enum class DecodeKeys : std::uint8_t { bf16, e4m3, nvfp4 };
enum class DecodeQuery : std::uint8_t { bf16, fp16, e4m3 };

// How a step's decode rows are cut into units: `unit_rows` consecutive rows
// (t * H + h) of one request, units_per_request of them per decode request.
struct DecodeScoreLaunch {
  static constexpr std::int32_t kMaxUnitRows = 32;
  // fp16 queries hold twice the fragments (bf16 hi + lo): units of 16 rows.
  static constexpr std::int32_t max_unit_rows(DecodeQuery q) { return q == DecodeQuery::fp16 ? 16 : kMaxUnitRows; }
  std::int32_t unit_rows = 0;          // <= kMaxUnitRows
  std::int32_t units_per_request = 0;
  std::int32_t num_units = 0;          // num_decodes * units_per_request
};

// Whether the kernel takes this key / query pair: e4m3 queries need e4m3 keys.
inline bool decode_scores_support(DecodeKeys keys, DecodeQuery query) {
  return query != DecodeQuery::e4m3 || keys == DecodeKeys::e4m3;
}

// Scores of every decode row for the blocks 0 .. min(seq_len - 1, 128 *
// block_limit - 1) / 128 of its request: the NaN-lowest max over its visible keys
// (nvfp4: times the cache's global scale), -inf where the block lies beyond
// the row's position; NaN where the block table points outside the cache
// (recorded in `check`). Columns beyond a request's blocks are left as they are.
// The cache's base and page stride must be 16-byte aligned (pages are bulk-copied).
//   scores: [num_tokens, num_kv_heads, max_blocks]
//   grid:   CTAs (one per SM; each takes an equal share of the blocks)
void launch_decode_scores(const StepView& step, const IndexerArgs& args, DecodeKeys keys, DecodeQuery query,
                          float* scores, std::int32_t max_blocks, std::int32_t block_limit,
                          const DecodeScoreLaunch& launch, int grid, std::int64_t* check, cudaStream_t stream);

}  // namespace msa::cuda::indexer
