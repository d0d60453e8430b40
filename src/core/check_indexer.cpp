// Shape checks of the indexer (contract 5 and 8): read no tensor data, so the
// CPU engine and the CUDA backend share them.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/checks.hpp"
#include "cpu/indexer_check.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

// Whether the rows data[t * token_stride + h * head_stride + (0 .. len)] for
// t < num_tokens, h < num_heads are pairwise disjoint: with the dimensions of
// more than one row sorted by |stride|, each stride must clear everything the
// inner dimensions span.
bool rows_disjoint(std::int64_t num_tokens, std::int64_t token_stride, std::int64_t num_heads,
                   std::int64_t head_stride, std::int64_t len) {
  struct Dim {
    std::int64_t count, stride;
  };
  Dim dims[2];
  int n = 0;
  if (num_tokens > 1) dims[n++] = {num_tokens, std::llabs(token_stride)};
  if (num_heads > 1) dims[n++] = {num_heads, std::llabs(head_stride)};
  std::sort(dims, dims + n, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  std::int64_t span = len;
  for (int i = 0; i < n; ++i) {
    if (dims[i].stride < span) return false;
    span += dims[i].stride * (dims[i].count - 1);
  }
  return true;
}

}  // namespace

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
  MSA_CHECK(!has_tokens || args.block_table.data != nullptr,
            "indexer: block_table.data is null but the step has ", step.num_tokens, " tokens");
  MSA_CHECK(args.block_table.num_rows >= step.num_requests, "indexer: block_table.num_rows = ",
            args.block_table.num_rows, " but the step has ", step.num_requests, " requests");
  MSA_CHECK(args.block_table.max_blocks >= 0, "indexer: block_table.max_blocks = ",
            args.block_table.max_blocks, " is negative");
}

void indexer_shape(const StepView& step, const IndexerArgs& args) {
  indexer_inputs_shape(step, args);
  const TopkView& out = args.out;
  MSA_CHECK(out.topk >= 1 && out.topk <= kMaxTopk, "indexer: out.topk = ", out.topk,
            " is outside [1, ", kMaxTopk, "]");
  MSA_CHECK(args.init_blocks >= 0, "indexer: init_blocks = ", args.init_blocks, " is negative");
  MSA_CHECK(args.local_blocks >= 0, "indexer: local_blocks = ", args.local_blocks, " is negative");
  MSA_CHECK(args.init_blocks + args.local_blocks <= out.topk, "indexer: init_blocks + local_blocks = ",
            args.init_blocks, " + ", args.local_blocks, " exceeds out.topk = ", out.topk);
  MSA_CHECK(step.num_tokens <= 0 || out.data != nullptr, "indexer: out.data is null but the step has ",
            step.num_tokens, " tokens");
  MSA_CHECK(rows_disjoint(step.num_tokens, out.token_stride, args.num_kv_heads, out.head_stride,
                          out.topk),
            "indexer: out rows overlap: token_stride = ", out.token_stride, ", head_stride = ",
            out.head_stride, " for ", step.num_tokens, " tokens x ", args.num_kv_heads,
            " KV heads of topk = ", out.topk);
}

}  // namespace msa::check
