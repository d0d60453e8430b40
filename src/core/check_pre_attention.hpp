// Input checks of pre-attention (contract 8, contract 10), shared by the CPU
// engine and the CUDA backend. Each throws msa::Error naming the argument, the
// index and the value of the first problem.
#pragma once

#include "msa/cache.hpp"
#include "msa/pre_attention.hpp"

namespace msa::check {

// The cache views, head counts, dtypes, scales and pointers. Reads no tensor
// data, so it runs on device arguments too.
void pre_attention_shape(const KVCacheView& cache, const IndexCacheView& index_cache,
                         const PreAttentionArgs& args);
// Positions within the cos/sin table, slots and index slots within their
// caches (negative slots skip). Host memory only.
void pre_attention_data(const KVCacheView& cache, const IndexCacheView& index_cache,
                        const PreAttentionArgs& args);

}  // namespace msa::check
