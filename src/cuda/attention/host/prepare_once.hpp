// Host helpers of the attention launchers: kernel preparation once per device,
// and the launch configuration of a cluster launch.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/common/check.cuh"

namespace msa::cuda::attention {

// Runs prepare(device) for the current device unless it already ran for it
// (bit d of `done`: device d; devices >= 64 are prepared on every call).
template <class Prepare>
void once_per_device(std::atomic<std::uint64_t>& done, Prepare&& prepare) {
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  const std::uint64_t bit = device < 64 ? std::uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return;
  prepare(device);
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes`, once per device.
template <class Kernel>
void raise_smem_limit_once(std::atomic<std::uint64_t>& done, Kernel kernel, int bytes) {
  once_per_device(done, [&](int) {
    MSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  });
}

// A launch of `grid` CTAs of `threads` threads and `smem` bytes of dynamic
// shared memory in clusters of `size` along x; `attr` holds the attribute the
// configuration points to.
inline cudaLaunchConfig_t cluster_launch_config(unsigned grid, unsigned threads, std::size_t smem, unsigned size,
                                                cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = size;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  return config;
}

}  // namespace msa::cuda::attention
