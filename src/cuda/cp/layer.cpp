// One rank of a context-parallel layer: the workspace layout and the steps
// that need no communication (propose, merge_topk, attend_owned, combine).
// The exchanges and run_layer are in nccl_exchange.cpp.
#include <cstddef>
#include <cstdint>

#include "cuda/cp/cp_checks.hpp"
#include "cuda/cp/merge.hpp"
#include "msa/common.hpp"
#include "msa/cuda.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"

namespace msa::cuda::cp {
namespace {

constexpr std::size_t kAlign = 256;

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the buffers inside a rank's workspace.
struct Layout {
  std::size_t attention = 0, attention_bytes = 0;
  std::size_t candidates = 0, topk = 0, owned = 0, partial_out = 0, partial_lse = 0, weighted = 0;
  std::size_t bytes = 0;
};

Layout layout_of(const BatchMetadata& meta, const SelectShape& select, const AttentionArgs& args,
                 std::int32_t num_ranks, const AttentionTuning& tuning, PartialMerge merge) {
  const auto T = std::size_t(meta.num_tokens), H = std::size_t(select.num_kv_heads);
  const auto K = std::size_t(select.topk), Hq = std::size_t(args.num_q_heads);
  const auto R = std::size_t(num_ranks);
  Layout l;
  l.attention_bytes = attention_workspace_bytes(meta, args, tuning);
  std::size_t at = round_up(l.attention_bytes);
  l.candidates = at;
  at += round_up(R * T * H * K * sizeof(Candidate));
  l.topk = at;
  at += round_up(T * H * K * sizeof(std::int32_t));
  l.owned = at;
  at += round_up(T * H * K * sizeof(std::int32_t));
  const bool reduce = merge == PartialMerge::reduce;
  l.partial_out = at;
  at += round_up((reduce ? 1 : R) * T * Hq * kHeadDim * dtype_bytes(args.out_dtype));
  l.partial_lse = at;
  at += round_up(R * T * Hq * sizeof(float));
  l.weighted = at;
  if (reduce) at += round_up(T * Hq * kHeadDim * sizeof(float));
  l.bytes = at;
  return l;
}

void check_shapes(const char* fn, const SelectShape& select, const AttentionArgs& args,
                  std::int32_t num_ranks, PartialMerge merge) {
  MSA_CHECK(merge == PartialMerge::gather || merge == PartialMerge::reduce, fn, ": merge = ", int(merge),
            " is neither gather (0) nor reduce (1)");
  MSA_CHECK(args.cache.num_kv_heads == select.num_kv_heads, fn, ": args.cache.num_kv_heads = ",
            args.cache.num_kv_heads, " but select.num_kv_heads = ", select.num_kv_heads);
  MSA_CHECK(args.topk.topk == select.topk, fn, ": args.topk.topk = ", args.topk.topk, " but select.topk = ",
            select.topk);
  MSA_CHECK(is_half(args.out_dtype), fn, ": args.out_dtype = ", dtype_name(args.out_dtype),
            " but the attention writes bf16 or fp16");
  MSA_CHECK(args.num_q_heads >= 1, fn, ": args.num_q_heads = ", args.num_q_heads,
            " but at least 1 is needed");
  MSA_CHECK(std::int64_t(num_ranks) * select.topk <= kMaxMergeCandidates, fn, ": num_ranks * topk = ",
            num_ranks, " * ", select.topk, " exceeds ", kMaxMergeCandidates);
}

void check_step(const char* fn, const LayerPlan& plan, const StepView& step) {
  MSA_CHECK(step.num_tokens == plan.num_tokens, fn, ": the plan is for ", plan.num_tokens,
            " tokens but the step has ", step.num_tokens);
}

TopkView topk_view(std::int32_t* data, const SelectShape& s) {
  return TopkView::token_major(data, s.num_kv_heads, s.topk);
}

}  // namespace

std::int64_t LayerPlan::candidate_count() const {
  return std::int64_t(num_tokens) * select.num_kv_heads * select.topk;
}
std::int64_t LayerPlan::partial_rows() const { return std::int64_t(num_tokens) * num_q_heads; }
std::size_t LayerPlan::candidate_bytes() const {
  return std::size_t(candidate_count()) * sizeof(Candidate);
}
std::size_t LayerPlan::partial_bytes() const {
  const std::size_t row = merge == PartialMerge::reduce ? kHeadDim * sizeof(float) : kHeadDim * dtype_bytes(out_dtype);
  return std::size_t(partial_rows()) * (row + sizeof(float));
}

std::size_t layer_workspace_bytes(const BatchMetadata& meta, const SelectShape& select, const AttentionArgs& args,
                                  std::int32_t num_ranks, const AttentionTuning& tuning, PartialMerge merge) {
  const char* fn = "cp::layer_workspace_bytes";
  detail::check_sharding(fn, Sharding{num_ranks, 0}, 0);
  check_shapes(fn, select, args, num_ranks, merge);
  return layout_of(meta, select, args, num_ranks, tuning, merge).bytes;
}

LayerPlan plan_layer(const Group& group, const BatchMetadata& meta, const SelectShape& select,
                     const AttentionArgs& args, const Workspace& workspace, Stream stream,
                     const AttentionTuning& tuning, PartialMerge merge) {
  const char* fn = "cp::plan_layer";
  detail::check_sharding(fn, group.sharding, group.rank);
  check_shapes(fn, select, args, group.sharding.num_ranks, merge);
  const StepView view = meta.view();
  detail::check_select(fn, view, select);
  const Layout l = layout_of(meta, select, args, group.sharding.num_ranks, tuning, merge);
  MSA_CHECK(workspace.bytes >= l.bytes, fn, ": workspace.bytes = ", workspace.bytes, " but ",
            group.sharding.num_ranks, " ranks x ", meta.num_tokens, " tokens need ", l.bytes);
  MSA_CHECK(workspace.data != nullptr, fn, ": workspace.data is null");
  MSA_CHECK(reinterpret_cast<std::uintptr_t>(workspace.data) % kAlign == 0, fn,
            ": workspace.data is not ", kAlign, "-byte aligned");
  auto* base = static_cast<std::uint8_t*>(workspace.data);
  LayerPlan p;
  p.group = group;
  p.select = select;
  p.num_tokens = meta.num_tokens;
  p.num_q_heads = args.num_q_heads;
  p.out_dtype = args.out_dtype;
  p.attention = plan_attention(meta, args, Workspace{base + l.attention, l.attention_bytes}, stream, tuning);
  p.candidates = reinterpret_cast<Candidate*>(base + l.candidates);
  p.topk = reinterpret_cast<std::int32_t*>(base + l.topk);
  p.owned = reinterpret_cast<std::int32_t*>(base + l.owned);
  p.merge = merge;
  p.partial_out = base + l.partial_out;
  p.partial_lse = reinterpret_cast<float*>(base + l.partial_lse);
  if (merge == PartialMerge::reduce) p.weighted = reinterpret_cast<float*>(base + l.weighted);
  return p;
}

void propose(const LayerPlan& plan, const StepView& step, const float* scores, Stream stream) {
  check_step("cp::propose", plan, step);
  local_candidates(step, plan.select, plan.group.sharding, plan.group.rank, scores,
                   plan.candidates + plan.group.rank * plan.candidate_count(), stream);
}

void propose(const LayerPlan& plan, const StepView& step, const float* scores, const TopkView& own_topk,
             Stream stream) {
  check_step("cp::propose", plan, step);
  topk_candidates(step, plan.select, plan.group.sharding, plan.group.rank, scores, own_topk,
                  plan.candidates + plan.group.rank * plan.candidate_count(), stream);
}

void merge_topk(const LayerPlan& plan, const StepView& step, Stream stream) {
  check_step("cp::merge_topk", plan, step);
  detail::merge_and_own(step, plan.select, plan.group.sharding, plan.group.rank, plan.candidates,
                        topk_view(plan.topk, plan.select), topk_view(plan.owned, plan.select), stream);
}

void attend_owned(const LayerPlan& plan, const StepView& step, const AttentionArgs& args,
                  Stream stream, const DeviceCheck& check) {
  const char* fn = "cp::attend_owned";
  check_step(fn, plan, step);
  MSA_CHECK(args.out_dtype == plan.out_dtype, fn, ": args.out_dtype = ", dtype_name(args.out_dtype),
            " but the plan has ", dtype_name(plan.out_dtype));
  MSA_CHECK(args.num_q_heads == plan.num_q_heads, fn, ": args.num_q_heads = ", args.num_q_heads,
            " but the plan has ", plan.num_q_heads);
  const std::int64_t rows = plan.partial_rows();
  AttentionArgs a = args;
  a.topk = topk_view(plan.owned, plan.select);
  const std::size_t slice = plan.merge == PartialMerge::reduce ? 0 : std::size_t(plan.group.rank);
  a.out = static_cast<std::uint8_t*>(plan.partial_out) + slice * std::size_t(rows) * kHeadDim * dtype_bytes(plan.out_dtype);
  a.lse = plan.partial_lse + plan.group.rank * rows;
  attend(plan.attention, step, a, stream, check);
}

void weigh_own(const LayerPlan& plan, Stream stream) {
  MSA_CHECK(plan.merge == PartialMerge::reduce, "cp::weigh_own: the plan merges by gather, not reduce");
  weigh_partial(plan.partial_out, plan.out_dtype, plan.partial_lse, plan.group.sharding.num_ranks,
                plan.group.rank, plan.partial_rows(), plan.weighted, stream);
}

void combine(const LayerPlan& plan, void* out, float* lse, Stream stream) {
  if (plan.merge == PartialMerge::reduce) {
    finish_weighted(plan.weighted, plan.partial_lse, plan.group.sharding.num_ranks, plan.partial_rows(), out,
                    plan.out_dtype, lse, stream);
    return;
  }
  merge_partials(plan.partial_out, plan.partial_lse, plan.out_dtype, plan.group.sharding.num_ranks,
                 plan.partial_rows(), out, plan.out_dtype, lse, stream);
}

}  // namespace msa::cuda::cp
