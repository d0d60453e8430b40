// attend: sparse attention of every token of the step over the blocks its KV
// head selected, into the caller's output (and lse).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "backend.hpp"
#include "bindings.hpp"
#include "msa/error.hpp"
#include "plan_blob.hpp"
#include "views.hpp"

namespace msa::py {

namespace {

// q: [num_tokens, num_q_heads, 128] bf16 / fp16 / fp8_e4m3; out: the same
// shape, bf16 / fp16 (the query's dtype, either for fp8); lse: [num_tokens,
// num_q_heads] f32 or none; topk: [num_tokens, num_kv_heads, topk] int32.
// CUDA needs the plan blob of plan_attention for this step.
void attend(const StepArgs& s, const Array& q, const Array& out, const OptArray& lse, const KVCacheArgs& kv,
            const Array& block_table, const Array& topk, const OptArray& plan, const OptString& q_dtype,
            const OptString& out_dtype, float q_scale, float softmax_scale, std::uintptr_t stream, int num_threads, const OptArray& check) {
  Placement where;
  const StepView step = step_view(s, where);
  AttentionArgs args;
  args.cache = kv_cache_view(kv, where);
  args.block_table = block_table_view(block_table, "block_table", where);
  args.topk = topk_view(topk, "topk", where);
  where.add(q, "q");
  where.add(out, "out");
  where.add(lse, "lse");
  args.q_dtype = element_dtype(q, q_dtype, "q");
  // An output whose array cannot say (numpy uint16) holds the half query's dtype.
  const bool like_q = !out_dtype && !has_own_dtype(out) && is_half(args.q_dtype);
  args.out_dtype = element_dtype(out, like_q ? OptString(dtype_name(args.q_dtype)) : out_dtype, "out");
  expect_shape(q, {step.num_tokens, -1, kHeadDim}, "q", "[num_tokens, num_q_heads, 128]");
  expect_shape(out, {step.num_tokens, dim(q, 1), kHeadDim}, "out", "[num_tokens, num_q_heads, 128] like q");
  expect_shape(topk, {step.num_tokens, args.cache.num_kv_heads, -1}, "topk", "[num_tokens, num_kv_heads, topk]");
  expect_contiguous(q, "q");
  expect_contiguous(out, "out");
  if (lse) {
    expect_dtype(*lse, DType::f32, "lse");
    expect_shape(*lse, {step.num_tokens, dim(q, 1)}, "lse", "[num_tokens, num_q_heads]");
    expect_contiguous(*lse, "lse");
    args.lse = ptr<float>(*lse);
  }
  args.q = data_of(q);
  args.out = data_of(out);
  args.num_q_heads = std::int32_t(dim(q, 1));
  args.q_scale = q_scale;
  args.softmax_scale = softmax_scale;
  if (where.cuda()) {
#if MSA_HAVE_CUDA
    MSA_CHECK(plan.has_value(), "plan: attend on a CUDA device needs the plan of plan_attention for this step");
    const cuda::AttentionPlan p = read_plan(*plan);
    const cuda::DeviceCheck dc = device_check(check, where);
    DeviceGuard guard(where.device());
    cuda::attend(p, step, args, stream_ptr(stream), dc);
#else
    (void)plan, (void)stream, (void)check;
    require_cuda_build("attend");
#endif
    return;
  }
  nb::gil_scoped_release nogil;
  cpu::attend(step, args, cpu_options(num_threads));
}

}  // namespace

void bind_attend(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "attend",
      [](const Array& query_start, const Array& seq_lens, const Array& token_request, std::int32_t num_decodes,
         std::int32_t decode_query_len, const Array& q, const OutArray& out, const Array& kv_cache,
         const Array& block_table, const Array& topk, const OptOutArray& lse, const OptArray& plan,
         const OptString& q_dtype, const OptString& out_dtype, float q_scale, float softmax_scale,
         const OptString& kv_dtype, float k_scale,
         float v_scale, const OptArray& k_scales, const OptArray& v_scales, std::uintptr_t stream, int num_threads,
         const OptOutArray& check) {
        attend(StepArgs{query_start, seq_lens, token_request, num_decodes, decode_query_len}, q, as_array(out),
               as_array(lse), KVCacheArgs{kv_cache, kv_dtype, k_scale, v_scale, k_scales, v_scales}, block_table, topk,
               plan, q_dtype, out_dtype, q_scale, softmax_scale, stream, num_threads, as_array(check));
      },
      "query_start"_a, "seq_lens"_a, "token_request"_a, "num_decodes"_a, "decode_query_len"_a, "q"_a, "out"_a,
      "kv_cache"_a, "block_table"_a, "topk"_a, nb::kw_only(), "lse"_a = nb::none(), "plan"_a = nb::none(),
      "q_dtype"_a = nb::none(), "out_dtype"_a = nb::none(), "q_scale"_a = 1.0f, "softmax_scale"_a = 0.08838834764831845f,
      "kv_dtype"_a = nb::none(), "k_scale"_a = 1.0f, "v_scale"_a = 1.0f, "k_scales"_a = nb::none(),
      "v_scales"_a = nb::none(), "stream"_a = 0, "num_threads"_a = 0, "check"_a = nb::none(),
      "Sparse attention of every token of the step into `out` ([num_tokens, num_q_heads, 128]) and, if "
      "given, `lse` ([num_tokens, num_q_heads] f32, natural log).");
}

}  // namespace msa::py
