// Host helpers shared by the plan (plan.cpp) and the run step (attend.cu).
#pragma once

#include "cuda/attention/host/heuristics.hpp"
#include "msa/cuda.hpp"

namespace msa::cuda::attention {

// Readies the kernel instances the problem runs (shared-memory limits, cluster
// capacities) on the current device, so that attend() itself makes no such
// call (graph capture).
void prepare_kernels(const AttentionProblem& problem);
// Cluster capacities of the problem's row kernel on the current device, the
// smaller of its two MMA types; with one_cta_per_sm, the clusters that fit when
// each SM holds one of its CTAs (what choose_splits' cost model assumes) for
// a kernel that fits two.
ClusterCapacity cluster_capacity(const AttentionProblem& problem, bool one_cta_per_sm = false);
// Cluster capacities of the row-kernel instance that runs the problem (its
// kind and row_f16's MMA type).
ClusterCapacity row_instance_capacity(const AttentionProblem& problem);

}  // namespace msa::cuda::attention
