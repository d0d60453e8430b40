// Host helpers shared by the plan (plan.cpp) and the run step (attend.cu).
#pragma once

#include "cuda/attention/heuristics.hpp"
#include "cuda/common/device.hpp"
#include "msa/cuda.hpp"

namespace msa::cuda::attention {

// Throws msa::Error naming the first unsupported field of the shape.
void check_shape(const AttentionShape& shape);
// Readies the kernel instances the shape runs (shared-memory limits, cluster
// capacities) on the current device, so that attend() itself makes no such
// call (graph capture).
void prepare_kernels(const AttentionShape& shape);
// Cluster capacities of the shape's row kernel on the current device; with
// one_cta_per_sm, the clusters that fit when each SM holds one of its CTAs
// (what choose_splits' cost model assumes) for a kernel that fits two.
ClusterCapacity cluster_capacity(const AttentionShape& shape, bool one_cta_per_sm = false);

}  // namespace msa::cuda::attention
