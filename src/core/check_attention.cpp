// Shape checks of a sparse attention call (contract 6 and 8): dtypes that go
// together, head counts, and every view (cache, block table, top-k, query,
// output, lse), with no output sharing memory with an input. Reads no tensor
// data, so the CUDA backend runs it on device arguments too.
#include <cmath>
#include <cstdint>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

void attention_shape(const StepView& step, const AttentionArgs& args) {
  step_shape(step);
  const char* qd = dtype_name(args.q_dtype);
  const char* od = dtype_name(args.out_dtype);
  MSA_CHECK(is_half(args.q_dtype) || args.q_dtype == DType::fp8_e4m3, "q_dtype = ", qd,
            " is not a query dtype (bf16, fp16 or fp8_e4m3)");
  MSA_CHECK(is_half(args.out_dtype), "out_dtype = ", od, " is not an output dtype (bf16 or fp16)");
  MSA_CHECK(!is_half(args.q_dtype) || args.out_dtype == args.q_dtype, "out_dtype = ", od,
            " but q_dtype = ", qd, " (the output takes the query dtype unless the query is fp8)");
  if (args.q_dtype == DType::fp8_e4m3) {
    MSA_CHECK(std::isfinite(args.q_scale) && args.q_scale > 0.0f, "q_scale = ", args.q_scale,
              " must be finite and positive for an fp8 query");
  }
  MSA_CHECK(std::isfinite(args.softmax_scale), "softmax_scale = ", args.softmax_scale,
            " is not finite");

  const KVCacheView& c = args.cache;
  MSA_CHECK(c.num_kv_heads >= 1, "cache.num_kv_heads = ", c.num_kv_heads, " must be >= 1");
  MSA_CHECK(args.num_q_heads >= 1, "num_q_heads = ", args.num_q_heads, " must be >= 1");
  MSA_CHECK(args.num_q_heads % c.num_kv_heads == 0, "num_q_heads = ", args.num_q_heads,
            " is not divisible by num_kv_heads = ", c.num_kv_heads);
  const int group = args.num_q_heads / c.num_kv_heads;
  MSA_CHECK(group <= kMaxGroup, "num_q_heads / num_kv_heads = ", args.num_q_heads, " / ",
            c.num_kv_heads, " = ", group, " query heads per KV head, more than ", kMaxGroup);
  MSA_CHECK(args.topk.topk >= 1 && args.topk.topk <= kMaxTopk, "topk.topk = ", args.topk.topk,
            " must be in [1, ", kMaxTopk, "]");
  cache_view(c);
  const Span table = block_table_view(args.block_table, step.num_requests, c.num_pages, "block_table");

  if (step.num_tokens == 0) return;
  MSA_CHECK(args.q != nullptr, "q is null but the step has ", step.num_tokens, " tokens");
  MSA_CHECK(args.out != nullptr, "out is null but the step has ", step.num_tokens, " tokens");
  const Span topk = topk_view(args.topk, step.num_tokens, c.num_kv_heads, "topk");
  const std::int64_t rows = size_of("q", step.num_tokens, args.num_q_heads);  // [num_tokens, num_q_heads]
  const Span q = dense_view(args.q, args.q_dtype, size_of("q", rows, kHeadDim), "q");
  const Span out = dense_view(args.out, args.out_dtype, size_of("out", rows, kHeadDim), "out");
  const Span lse = dense_view(args.lse, DType::f32, rows, "lse", true);
  const CacheSpans cache = cache_spans(c);
  for (const Span* w : {&out, &lse}) {
    for (const Span* r : {&q, &topk, &table, &cache.k, &cache.v, &cache.k_scales, &cache.v_scales})
      no_overlap(*w, *r);
  }
  no_overlap(out, lse);
}

}  // namespace msa::check
