// Plan step of the CUDA sparse attention: checks the problem and the tuning,
// readies the kernels, gathers what the schedule needs of the device (SM
// count, cluster capacities, TMA support), makes the schedule (schedule.hpp)
// and enqueues the zeroing of its split counters on the stream.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/host/plan_internal.hpp"
#include "cuda/attention/host/schedule.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {

AttentionProblem AttentionProblem::of(const AttentionArgs& args) {
  AttentionProblem p;
  p.num_q_heads = args.num_q_heads;
  p.num_kv_heads = args.cache.num_kv_heads;
  p.topk = args.topk.topk;
  p.q_dtype = args.q_dtype;
  p.kv_dtype = args.cache.dtype;
  p.out_dtype = args.out_dtype;
  p.kv_token_scales = is_fp8(args.cache.dtype) && args.cache.scale_mode == ScaleMode::per_token_head;
  return p;
}

namespace attention {
namespace {

// Readies the problem's kernels, then what the schedule needs of the device.
DeviceFacts device_facts(const AttentionProblem& problem) {
  prepare_kernels(problem);
  DeviceFacts f;
  f.num_sms = device_sm_count();
  // The split rule's cost model counts one CTA per SM, so its clusters fit
  // when they do at one CTA per SM, also for fp8 rows of per-tensor scales,
  // whose kernel fits two.
  const bool converted =
      row_converts_slowly(problem.kv_dtype, problem.out_dtype == DType::fp16, problem.kv_token_scales);
  f.split_capacity = cluster_capacity(problem, !converted);
  f.row_capacity = row_instance_capacity(problem);
  f.tensor_maps = tensor_maps_available();
  f.k2q_bytes = &k2q_workspace_bytes;
  return f;
}

AttentionSchedule schedule_of(const BatchMetadata& meta, const AttentionProblem& problem,
                              const AttentionTuning& tuning) {
  check_problem(problem);
  check_tuning(tuning);
  return make_schedule(meta, problem, tuning, device_facts(problem));
}

}  // namespace
}  // namespace attention

std::size_t attention_workspace_bytes(const BatchMetadata& meta, const AttentionArgs& args,
                                      const AttentionTuning& tuning) {
  return attention::schedule_of(meta, AttentionProblem::of(args), tuning).map.bytes;
}

AttentionPlan plan_attention(const BatchMetadata& meta, const AttentionArgs& args, const Workspace& workspace,
                             Stream stream, const AttentionTuning& tuning) {
  AttentionPlan plan;
  plan.schedule = attention::schedule_of(meta, AttentionProblem::of(args), tuning);
  plan.workspace = workspace;
  const AttentionWorkspaceMap& m = plan.schedule.map;
  MSA_CHECK(workspace.bytes >= m.bytes, "attention plan: workspace.bytes = ", workspace.bytes,
            " but the plan needs ", m.bytes, " (see attention_workspace_bytes)");
  MSA_CHECK(m.bytes == 0 || workspace.data != nullptr, "attention plan: workspace.data is null but ", m.bytes,
            " bytes are needed");
  MSA_CHECK(reinterpret_cast<std::uintptr_t>(workspace.data) % 16 == 0,
            "attention plan: workspace.data must be 16-byte aligned");
  // The split counters start at 0; attend() leaves them at 0 again.
  if (m.counter_bytes > 0)
    MSA_CUDA_CHECK(cudaMemsetAsync(static_cast<unsigned char*>(workspace.data) + m.counters, 0, m.counter_bytes,
                                   static_cast<cudaStream_t>(stream)));
  return plan;
}

bool AttentionPlan::valid_for(const BatchMetadata& meta, const AttentionArgs& args, std::string* why) const {
  auto no = [&](const std::string& reason) {
    if (why != nullptr) *why = reason;
    return false;
  };
  const AttentionProblem problem = AttentionProblem::of(args);
  if (!(problem == schedule.problem)) return no("the arguments' problem (heads, top-k, dtypes, scales) differs");
  const AttentionSchedule now = attention::schedule_of(meta, problem, schedule.tuning);
  if (now.num_tokens != schedule.num_tokens || now.num_decode_tokens != schedule.num_decode_tokens)
    return no("the token counts differ");
  if (!(now == schedule)) return no("the step's schedule differs (request count or lengths)");
  if (workspace.bytes < now.map.bytes) return no("the workspace is too small");
  if (why != nullptr) why->clear();
  return true;
}

}  // namespace msa::cuda
