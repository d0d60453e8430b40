// The prefill block-score kernel of the indexer on Hopper tensor cores
// (prefill_scores.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::indexer {

// Rows of one tile: 256 consecutive rows (t * H + h) of one prefill request.
inline constexpr std::int32_t kPrefillTileRows = 256;

// The index cache's keys and the query type: bf16 and e4m3 keys with a query of
// the same type; nvfp4 keys widened in shared memory to the query's bf16 / fp16;
// nvfp4 keys widened ahead into bf16 / fp16 blocks (widen_keys.hpp).
enum class PrefillKeys : std::uint8_t { bf16, e4m3, nvfp4_bf16, nvfp4_fp16, widened_bf16, widened_fp16 };

// Scores of every prefill row (requests num_decodes .. num_requests - 1) for
// the blocks 0 .. its tile's last block (the block of the tile's last
// position, capped at block_limit - 1): the NaN-lowest max over the visible
// keys (j <= p); -inf where the block lies beyond the row's own; NaN where the
// block table points outside the cache (recorded in `check`).
//   key_map:   the index cache's tensor map (index_map.hpp), or for widened
//              keys the map of the widened blocks (block b of request r at
//              widened_slot); unused for nvfp4, whose pages are bulk copies
//   query_map: rows [num_tokens * H, 128] of the index query, boxes of 256 rows
//   scores:    [num_tokens, num_kv_heads, max_blocks]
void launch_prefill_scores(const StepView& step, const IndexerArgs& args, PrefillKeys keys,
                           const CUtensorMap& key_map, const CUtensorMap& query_map, float* scores,
                           std::int32_t max_blocks, std::int32_t block_limit, int grid, std::int64_t* check,
                           cudaStream_t stream);

}  // namespace msa::cuda::indexer
