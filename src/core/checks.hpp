// Host-side input checks shared by the CPU engine and the CUDA backend.
// Each throws msa::Error naming the argument, the index and the value of the
// first problem (contract 8). "shape" checks read no tensor data, so they run
// on device arguments too; "data" checks read indices and need host memory.
#pragma once

#include <cstdint>

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

// check_insert.cpp -------------------------------------------------------------
void cache_view(const KVCacheView& cache);
void index_cache_view(const IndexCacheView& cache);
void insert_kv_shape(const KVCacheView& cache, const InsertKVArgs& args);
void insert_index_shape(const IndexCacheView& cache, const InsertIndexArgs& args);
// Slots must be negative (skip) or < num_pages * 128.
void slots_data(const std::int64_t* slots, std::int64_t num_tokens, std::int64_t num_pages,
                const char* what);

// check_indexer.cpp --------------------------------------------------------------
void indexer_shape(const StepView& step, const IndexerArgs& args);

// check_attention.cpp ------------------------------------------------------------
void attention_shape(const StepView& step, const AttentionArgs& args);

}  // namespace msa::check
