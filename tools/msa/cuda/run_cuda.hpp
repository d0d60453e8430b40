// The CUDA path of `msa run`: the step's insert, index and attend on the GPU.
#pragma once

#include "qkv_step.hpp"
#include "workload.hpp"

namespace msa::tool {

// Device time of each stage (CUDA events; each stage is run once to warm up
// and once timed, insert on a fresh copy of the cache both times).
struct CudaStageTimes {
  double insert_s = 0.0;
  double index_s = 0.0;
  double attend_s = 0.0;
  std::string device;  // e.g. "NVIDIA H200"
};

// Device bytes run_step_cuda allocates for a workload of this spec (the KV
// cache twice: as before the insert and the copy the step writes; with the
// qkv input, its rows and rope table), computed before anything is allocated.
double run_step_cuda_bytes(const WorkloadSpec& spec, bool qkv_input);
// Free memory of the current device, bytes.
double device_free_bytes();

// Copies the workload to the device, runs insert (with `qkv`: pre-attention
// from its qkv rows, which also writes q and index q), index and attend there
// with the device checks on, and copies the caches, q, index q, top-k, output
// and lse back into the workload's host buffers, so the float64 oracle checks
// what the GPU did. Throws msa::Error on a CUDA error or a bad index the
// device checks found.
CudaStageTimes run_step_cuda(Workload& w, const QkvStep* qkv = nullptr);

}  // namespace msa::tool
