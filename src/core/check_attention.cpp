// Shape checks of a sparse attention call (contract 6 and 8): dtypes that go
// together, head counts, top-k width, cache scales and null pointers. Reads no
// tensor data, so the CUDA backend runs it on device arguments too.
#include <cmath>
#include <cstdint>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

void cache_scales(const KVCacheView& c) {
  const char* dt = dtype_name(c.dtype);
  switch (c.dtype) {
    case DType::bf16:
    case DType::fp16:
      MSA_CHECK(c.scale_mode == ScaleMode::none, "cache.scale_mode = ",
                c.scale_mode == ScaleMode::per_tensor ? "per_tensor" : "per_token_head",
                " but a ", dt, " cache has no scales (expected none)");
      return;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      MSA_CHECK(c.scale_mode != ScaleMode::none, "cache.scale_mode = none but an ", dt,
                " cache needs per_tensor or per_token_head scales");
      if (c.scale_mode == ScaleMode::per_token_head) {
        MSA_CHECK(c.k_scales != nullptr, "cache.k_scales is null but scale_mode = per_token_head");
        MSA_CHECK(c.v_scales != nullptr, "cache.v_scales is null but scale_mode = per_token_head");
        return;
      }
      break;
    case DType::nvfp4:
      MSA_CHECK(c.scale_mode != ScaleMode::per_token_head,
                "cache.scale_mode = per_token_head but an nvfp4 cache has group scales and one "
                "global scale per tensor (expected per_tensor)");
      break;
    default:
      fail("cache.dtype = ", dt, " is not a KV cache dtype (bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4)");
  }
  // per_tensor fp8 scales, or the nvfp4 global scales.
  MSA_CHECK(std::isfinite(c.k_scale) && c.k_scale > 0.0f, "cache.k_scale = ", c.k_scale,
            " must be finite and positive");
  MSA_CHECK(std::isfinite(c.v_scale) && c.v_scale > 0.0f, "cache.v_scale = ", c.v_scale,
            " must be finite and positive");
}

}  // namespace

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
  cache_scales(c);
  MSA_CHECK(c.num_pages >= 0, "cache.num_pages = ", c.num_pages, " is negative");
  MSA_CHECK(args.block_table.num_rows >= step.num_requests, "block_table.num_rows = ",
            args.block_table.num_rows, " but the step has ", step.num_requests, " requests");

  if (step.num_tokens == 0) return;
  MSA_CHECK(args.q != nullptr, "q is null but the step has ", step.num_tokens, " tokens");
  MSA_CHECK(args.out != nullptr, "out is null but the step has ", step.num_tokens, " tokens");
  MSA_CHECK(args.topk.data != nullptr, "topk.data is null but the step has ", step.num_tokens,
            " tokens");
  if (c.num_pages == 0) return;  // only padding requests can run on an empty cache
  MSA_CHECK(c.k != nullptr, "cache.k is null but the cache has ", c.num_pages, " pages");
  MSA_CHECK(c.dtype == DType::nvfp4 || c.v != nullptr, "cache.v is null but the cache has ",
            c.num_pages, " pages");
  MSA_CHECK(args.block_table.data != nullptr, "block_table.data is null but the cache has ",
            c.num_pages, " pages");
}

}  // namespace msa::check
