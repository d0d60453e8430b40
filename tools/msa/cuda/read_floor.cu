#include "read_floor.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/check.cuh"
#include "msa/error.hpp"

namespace msa::tool {

namespace {

constexpr int kStages = 3;
constexpr int kThreads = 256;

__device__ __forceinline__ void copy16(std::uint32_t dst, const unsigned char* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// CTA c takes units [c * count / grid, (c + 1) * count / grid), kStages in flight.
__global__ void __launch_bounds__(kThreads) gather_kernel(const unsigned char* base, const std::int64_t* offsets,
                                                          std::int32_t count, std::int32_t unit_bytes) {
  extern __shared__ __align__(128) unsigned char smem[];
  const std::int32_t begin = std::int32_t(std::int64_t(blockIdx.x) * count / gridDim.x);
  const std::int32_t end = std::int32_t(std::int64_t(blockIdx.x + 1) * count / gridDim.x);
  const std::int32_t n = end - begin;
  const auto stages = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem));
  auto issue = [&](int stage, std::int32_t i) {
    const unsigned char* src = base + offsets[begin + i];
    const std::uint32_t dst = stages + std::uint32_t(stage) * std::uint32_t(unit_bytes);
    for (std::int32_t b = std::int32_t(threadIdx.x) * 16; b < unit_bytes; b += kThreads * 16)
      copy16(dst + std::uint32_t(b), src + b);
  };
  for (int s = 0; s < kStages; ++s) {
    if (s < n) issue(s, s);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (std::int32_t i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncthreads();  // every thread's copies of block i landed; its stage is free again
    if (i + kStages < n) issue(int(i % kStages), i + kStages);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

}  // namespace

void gather_blocks(const void* base, const std::int64_t* offsets, std::int32_t count, std::int32_t unit_bytes,
                   cuda::Stream stream) {
  MSA_CHECK(unit_bytes > 0 && unit_bytes % 16 == 0 && unit_bytes <= kReadFloorMaxUnit,
            "gather_blocks: unit_bytes = ", unit_bytes, " is not a positive multiple of 16 up to ",
            kReadFloorMaxUnit);
  if (count <= 0) return;
  const int smem = kStages * unit_bytes;
  int device = 0, num_sms = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  MSA_CUDA_CHECK(cudaFuncSetAttribute(gather_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int grid = std::max(1, std::min(count, num_sms));
  gather_kernel<<<grid, kThreads, smem, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned char*>(base), offsets, count, unit_bytes);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::tool
