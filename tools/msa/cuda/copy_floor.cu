#include "copy_floor.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "msa/error.hpp"

namespace msa::tool {

namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 4;  // 16-byte loads a thread issues before its stores

// Grid-stride over 16-byte pieces, kInFlight of them a thread and pass.
//   src, dst: [n] pieces
__global__ void __launch_bounds__(kThreads) copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                        std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * kThreads;
  std::int64_t i = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kInFlight - 1) * stride < n; i += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) __stcs(dst + i + u * stride, v[u]);
  }
  for (; i < n; i += stride) __stcs(dst + i, __ldcs(src + i));
}

}  // namespace

void copy_on_sms(void* dst, const void* src, std::size_t bytes, cuda::Stream stream) {
  MSA_CHECK(bytes % 16 == 0, "copy_on_sms: bytes = ", bytes, " is not a multiple of 16");
  if (bytes == 0) return;
  int per_sm = 0;
  MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, copy_kernel, kThreads, 0));
  const std::int64_t n = std::int64_t(bytes / 16);
  const std::int64_t needed = (n + kThreads - 1) / kThreads;
  const std::int64_t resident = std::int64_t(cuda::device_sm_count()) * per_sm;
  const int grid = int(std::max<std::int64_t>(1, std::min(needed, resident)));
  copy_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<const uint4*>(src),
                                                                         static_cast<uint4*>(dst), n);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::tool
