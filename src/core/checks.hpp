// Host-side input checks shared by the CPU engine and the CUDA backend.
// Each throws msa::Error naming the argument, the index and the value of the
// first problem (contract 8). "shape" checks read no tensor data, so they run
// on device arguments too; "data" checks read indices and need host memory.
#pragma once

#include <cstdint>

#include "core/view_span.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/config.hpp"
#include "msa/ops.hpp"

namespace msa::check {

// check_step.cpp -------------------------------------------------------------
// StepView fields and, for host memory, query_start/seq_lens/token_request.
void step_shape(const StepView& step);
void step_data(const StepView& step);
// Every block-table entry a request needs (blocks < ceil(seq_len/128)) is in
// [0, num_pages). `what` names the table in messages ("block_table").
void block_table_data(const StepView& step, const BlockTable& table, std::int64_t num_pages,
                      const char* what);

// check_topk.cpp ---------------------------------------------------------------
// Every row of tokens [begin, end): valid entries first, then -1; ids in
// [0, p/128] and < the request's blocks; no duplicates; at most topk.
void topk_data(const StepView& step, const TopkView& topk, int num_kv_heads,
               std::int32_t token_begin, std::int32_t token_end);

// check_cache_view.cpp ---------------------------------------------------------
// Dtype, scales, strides (of the right sign, rows that never share an element
// except K and V interleaved as a layout defines), alignment of the bases to
// their element, sizes that fit the address space.
void cache_view(const KVCacheView& cache);
void index_cache_view(const IndexCacheView& cache);
// The memory a valid view declares: K and V pages (num_pages pages from each
// base; v empty for nvfp4) and the per-token scales.
struct CacheSpans {
  Span k, v, k_scales, v_scales;
};
CacheSpans cache_spans(const KVCacheView& cache);
Span index_cache_span(const IndexCacheView& cache);

// check_views.cpp --------------------------------------------------------------
// A block table of at least `num_requests` rows: non-negative max_blocks, rows
// that do not overlap (row_stride >= max_blocks), aligned data, non-null when
// a request may read it (max_blocks > 0 and a cache of num_pages > 0 pages).
// `what` names it in messages ("block_table", "indexer: block_table").
Span block_table_view(const BlockTable& table, std::int64_t num_requests, std::int64_t num_pages,
                      const char* what);
// A top-k view of [num_tokens, num_kv_heads, topk]: topk in [1, 64], aligned
// data (non-null with tokens), strides not negative and rows that never
// overlap. `what` names it ("topk", "indexer: out").
Span topk_view(const TopkView& topk, std::int64_t num_tokens, std::int64_t num_kv_heads,
               const char* what);
// A dense array of `count` elements of `dtype` (non-null when count > 0 unless
// `optional`, aligned to its element).
Span dense_view(const void* data, DType dtype, std::int64_t count, const char* what,
                bool optional = false);

// check_insert.cpp -------------------------------------------------------------
// The cache view, the sources' views, and no output sharing memory with an input.
void insert_kv_shape(const KVCacheView& cache, const InsertKVArgs& args);
void insert_index_shape(const IndexCacheView& cache, const InsertIndexArgs& args);
// Slots must be negative (skip) or < num_pages * 128.
void slots_data(const std::int64_t* slots, std::int64_t num_tokens, std::int64_t num_pages,
                const char* what);

// check_indexer.cpp --------------------------------------------------------------
// Every view of the call (index queries, cache, block table, output) and no
// output sharing memory with an input.
void indexer_shape(const StepView& step, const IndexerArgs& args);

// check_attention.cpp ------------------------------------------------------------
// Every view of the call (query, cache, block table, top-k, output, lse) and no
// output sharing memory with an input.
void attention_shape(const StepView& step, const AttentionArgs& args);

}  // namespace msa::check
