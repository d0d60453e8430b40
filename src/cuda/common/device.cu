#include "cuda/common/device.hpp"

#include <atomic>

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "msa/cuda.hpp"

namespace msa::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

int device_sm_count() {
  // Launchers ask on every call: the answer is kept per device (the first 64).
  constexpr int kCached = 64;
  static std::atomic<int> cached[kCached] = {};
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  if (device < kCached) {
    if (const int sms = cached[device].load(std::memory_order_relaxed); sms > 0) return sms;
  }
  int sms = 0;
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (device < kCached) cached[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace msa::cuda
