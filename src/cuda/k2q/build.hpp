// What the key-major attention asks of the device k2q plan beyond
// msa::cuda::build_k2q (include/msa/cuda.hpp): the lse of every partial that
// no edge will write, set to -inf while the edges are made, so that the merge
// leaves those slots out without a pass over all the partials.
#pragma once

#include <cstddef>
#include <cstdint>

#include "msa/cuda.hpp"

namespace msa::cuda {

struct K2QUnplacedLse {
  float* lse = nullptr;  // [num_tokens, topk, num_kv_heads * group], or null: nothing written
  int group = 1;         // query heads per KV head
};

// build_k2q, and -inf at unplaced.lse's slots (t, k, h * group + g) of every
// entry (t, h, k) that the plan does not place.
// Whether build_k2q sorts the step's edges by the chunk sort (chunk_sort.cuh)
// rather than the device-wide radix sort; for the tests to cover both.
bool k2q_sorts_in_chunks(std::int32_t num_tokens, int num_kv_heads, int topk, std::int64_t num_rows);

void build_k2q_with(const StepView& step, const TopkView& topk, int num_kv_heads, std::int64_t num_rows,
                    const K2QDevicePlan& plan, void* workspace, std::size_t workspace_bytes, Stream stream,
                    const DeviceCheck& check, const K2QUnplacedLse& unplaced);

}  // namespace msa::cuda
