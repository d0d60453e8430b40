// Blocks widened ahead for the token tiles of an fp8 / nvfp4 prefill step
// (widen/choice.hpp says why): the region in the plan's workspace, the two
// kernels that fill it, and the parameters and tensor maps of the bf16 /
// fp16 token tiles that then read it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/params.cuh"
#include "cuda/attention/widen/choice.hpp"
#include "msa/cuda.hpp"

namespace msa::cuda::attention {

// The region of a plan that widens (schedule.widen_pages > 0).
struct WidenArea {
  WidenChoice choice;
  AttentionWorkspaceMap map;
  unsigned char* base = nullptr;  // the workspace
  int num_kv_heads = 0;
  bool f16 = false;  // the MMA type: fp16 (an fp16 output), else bf16

  std::int32_t* table() const { return reinterpret_cast<std::int32_t*>(base + map.widen_table); }
  std::int32_t* counters() const { return reinterpret_cast<std::int32_t*>(base + map.widen_counters); }
  std::int32_t* claims() const { return reinterpret_cast<std::int32_t*>(base + map.widen_claims); }
  std::int32_t* items() const { return reinterpret_cast<std::int32_t*>(base + map.widen_items); }
  std::int64_t* gates() const { return reinterpret_cast<std::int64_t*>(base + map.widen_gates); }
  unsigned char* k() const { return base + map.widen_k; }
  unsigned char* v() const { return base + map.widen_v; }
  float* scales() const { return reinterpret_cast<float*>(base + map.widen_scales); }  // (choice.scales)
  // The pages' scales for a step whose cache has per-token scales (p.cache.k_scales), else null.
  float* token_scales(const AttendParams& p) const {
    return choice.scales && p.cache.k_scales != nullptr ? scales() : nullptr;
  }
};

// The schedule's region in the workspace at `base`; throws msa::Error when
// the step is not the one the plan was made for (its first prefill request
// and prefill request count).
WidenArea widen_area(const AttentionSchedule& schedule, unsigned char* base, const StepView& step);

// Enqueues the step's widening on `stream`: the claims' reset; a thread per
// (prefill token, KV head, top-k entry) that checks the entry as the token
// tiles would (bad ids and block-table entries go to p.check), claims each
// eligible selected (request, KV head, block) once and a page for each
// (request, block); then each claimed triple's K and V widened into its page,
// exactly (widens_exactly: per-tensor and nvfp4 global scales stay in p's
// score and output scales), with its per-token scales (p.cache.k_scales /
// p.cache.v_scales, area.choice.scales) copied beside it: V scales 0 past the
// request's last key. A gated step writes the two kernels' tile gates
// (area.gates()).
//   p: the step's parameters (make_params); kv: the cache dtype (fp8 or nvfp4)
void widen_ahead(const AttendParams& p, const WidenArea& area, DType kv, cudaStream_t stream);

// The token tiles' parameters over the widened pages (from p, the cache's);
// gated steps run them behind area.gates()[0]. With per-token scales,
// k_scales points at the pages' scales (widen/choice.hpp), v_scales is null.
AttendParams widened_params(const AttendParams& p, const WidenArea& area);

// The TMA maps of the widened pages; false when the driver cannot encode them.
bool widened_maps(const WidenArea& area, KvMaps& maps);

}  // namespace msa::cuda::attention
