#include "cuda/common/device.hpp"

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
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  int sms = 0;
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

}  // namespace msa::cuda
