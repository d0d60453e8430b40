// Shape checks of the indexer (contract 5 and 8): read no tensor data, so the
// CPU engine and the CUDA backend share them.
#include <cstdint>

#include "core/checks.hpp"
#include "cpu/indexer_check.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"

namespace msa::check {

void indexer_inputs_shape(const StepView& step, const IndexerArgs& args) {
  step_shape(step);
  const bool has_tokens = step.num_tokens > 0;
  MSA_CHECK(args.num_kv_heads >= 1, "indexer: num_kv_heads = ", args.num_kv_heads,
            " but at least 1 is needed");
  MSA_CHECK(is_half(args.iq_dtype) || (args.iq_dtype == DType::fp8_e4m3 && args.cache.dtype == DType::fp8_e4m3),
            "indexer: iq_dtype = ", dtype_name(args.iq_dtype), " with an index cache of ",
            dtype_name(args.cache.dtype),
            " (the index query is bf16 or fp16, or fp8_e4m3 with an fp8_e4m3 cache)");
  MSA_CHECK(!has_tokens || args.index_q != nullptr, "indexer: index_q is null but the step has ",
            step.num_tokens, " tokens");
  MSA_CHECK(args.cache.dtype == DType::bf16 || args.cache.dtype == DType::fp8_e4m3 ||
                args.cache.dtype == DType::nvfp4,
            "indexer: cache.dtype = ", dtype_name(args.cache.dtype),
            " but the index cache must be bf16, fp8_e4m3 or nvfp4");
  MSA_CHECK(!has_tokens || args.cache.base != nullptr, "indexer: cache.base is null but the step has ",
            step.num_tokens, " tokens");
  MSA_CHECK(args.cache.num_pages >= 0, "indexer: cache.num_pages = ", args.cache.num_pages,
            " is negative");
  index_cache_view(args.cache);
  block_table_view(args.block_table, step.num_requests, args.cache.num_pages, "indexer: block_table");
  dense_view(args.index_q, args.iq_dtype,
             size_of("indexer: index_q", std::int64_t(step.num_tokens) * args.num_kv_heads, kHeadDim),
             "indexer: index_q");
}

void indexer_shape(const StepView& step, const IndexerArgs& args) {
  indexer_inputs_shape(step, args);
  const TopkView& out = args.out;
  const Span written = topk_view(out, step.num_tokens, args.num_kv_heads, "indexer: out");
  MSA_CHECK(args.init_blocks >= 0, "indexer: init_blocks = ", args.init_blocks, " is negative");
  MSA_CHECK(args.local_blocks >= 0, "indexer: local_blocks = ", args.local_blocks, " is negative");
  MSA_CHECK(std::int64_t(args.init_blocks) + args.local_blocks <= out.topk, "indexer: init_blocks + local_blocks = ",
            args.init_blocks, " + ", args.local_blocks, " exceeds out.topk = ", out.topk);
  no_overlap(written, dense_view(args.index_q, args.iq_dtype,
                                 std::int64_t(step.num_tokens) * args.num_kv_heads * kHeadDim,
                                 "indexer: index_q"));
  no_overlap(written, index_cache_span(args.cache));
  no_overlap(written, block_table_view(args.block_table, step.num_requests, args.cache.num_pages,
                                       "indexer: block_table"));
}

}  // namespace msa::check
