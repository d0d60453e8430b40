// The steps around the key-major launch of a prefill step (key_major.cu): the
// k2q plan and its work items, the device's choice between the key-major and
// the token-tile kernels, and the merge of each token's partials. The kernel
// itself is attend_key_major_kernel (key_major/kernel.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/params.cuh"
#include "msa/cuda.hpp"

namespace msa::cuda::attention {

// Where one key-major step's data live in the plan's workspace.
struct KeyMajorBuffers {
  AttentionWorkspaceMap map;
  unsigned char* base = nullptr;  // the workspace
  KeyMajorItem* items() const { return reinterpret_cast<KeyMajorItem*>(base + map.km_items); }
  std::int64_t* stats() const { return reinterpret_cast<std::int64_t*>(base + map.km_stats); }
  std::int32_t* tokens() const { return reinterpret_cast<std::int32_t*>(base + map.k2q_tokens); }
  std::int32_t* slots() const { return reinterpret_cast<std::int32_t*>(base + map.k2q_slots); }
  void* partial_out() const { return base + map.km_partial_out; }
  float* partial_lse() const { return reinterpret_cast<float*>(base + map.km_partial_lse); }
  // stats: [0] items written, [1] tile rounds, [2] key-major gate, [3] token-tile gate,
  // [4] CTAs done counting (kKeyMajorStats)
  const std::int64_t* key_major_gate() const { return stats() + 2; }
  const std::int64_t* tile_gate() const { return stats() + 3; }
};

// Enqueues on `stream`: the k2q plan (msa::cuda::build_k2q), with -inf in
// the lse of every partial that no edge writes; the work items of
// key_major_item_tokens tokens; the choice (prefer_key_major; `always`: the
// order is key-major) into the gates.
void prepare_key_major(const KeyMajorBuffers& km, const AttentionSchedule& schedule, const StepView& step,
                       const AttentionArgs& args, const AttendParams& p, bool always, cudaStream_t stream,
                       const DeviceCheck& check);

// Merges each (token, query head)'s partials into p.out / p.lse: always
// (`always`), or if the device chose key-major.
void combine_key_major(const KeyMajorBuffers& km, const AttendParams& p, bool always, cudaStream_t stream);
// Merges the split tiles' partials (p.tile_partial_out / lse, p.tile_splits
// slots per row) of the prefill rows into p.out / p.lse.
void combine_tile_splits(const AttendParams& p, cudaStream_t stream);

// The key-major kernel over the work items (key_major/kernel.cuh; instances.cmake).
template <bool kF16>
void launch_attend_key_major(const AttendParams& p, const KvMaps& maps, cudaStream_t stream);
template <bool kF16>
void prepare_attend_key_major();

}  // namespace msa::cuda::attention
