#include "fill.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/check.cuh"
#include "device_random.cuh"
#include "msa/cache.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::tool {

namespace {

template <int Tag>  // 0 f32, 1 bf16, 2 fp16, 3 e4m3, 4 e5m2
__global__ void fill_random_kernel(void* dst, std::int64_t count, float scale, std::uint64_t seed) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float x = scale * normal_from(hash64(seed ^ hash64(std::uint64_t(i))));
    if constexpr (Tag == 0) static_cast<float*>(dst)[i] = x;
    if constexpr (Tag == 1) static_cast<std::uint16_t*>(dst)[i] = num::float_to_bf16(x);
    if constexpr (Tag == 2) static_cast<std::uint16_t*>(dst)[i] = num::float_to_fp16(x);
    if constexpr (Tag == 3) static_cast<std::uint8_t*>(dst)[i] = num::float_to_e4m3(x);
    if constexpr (Tag == 4) static_cast<std::uint8_t*>(dst)[i] = num::float_to_e5m2(x);
  }
}

__global__ void fill_nvfp4_kernel(std::uint8_t* base, std::int64_t bytes, std::int64_t page_stride,
                                  std::int64_t page_bytes, std::uint64_t seed) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes; i += stride) {
    const std::uint64_t h = hash64(seed ^ hash64(std::uint64_t(i)));
    const std::int64_t in_page = i % page_stride;
    std::uint8_t b = std::uint8_t(h);
    if (in_page < page_bytes && in_page % nvfp4::kSlotBytes >= kBlockSize * nvfp4::kDataBytes) {
      b = num::float_to_e4m3(0.25f + 0.75f * float(std::uint32_t(h >> 40)) * (1.0f / 16777216.0f));
    } else if (in_page < page_bytes) {
      // Never the negative zero code (8) in either nibble.
      if ((b & 0x0F) == 0x08) b &= 0xF0;
      if ((b & 0xF0) == 0x80) b &= 0x0F;
    }
    base[i] = b;
  }
}

__global__ void fill_int32_kernel(std::int32_t* dst, std::int64_t count, std::int32_t value) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = value;
}

int grid_for(std::int64_t count) {
  return int(std::clamp<std::int64_t>((count + 255) / 256, 1, 65536));
}

}  // namespace

void fill_random(void* dst, std::int64_t count, DType dtype, float scale, std::uint64_t seed,
                 cuda::Stream stream) {
  if (count <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int grid = grid_for(count);
  switch (dtype) {
    case DType::f32: fill_random_kernel<0><<<grid, 256, 0, s>>>(dst, count, scale, seed); break;
    case DType::bf16: fill_random_kernel<1><<<grid, 256, 0, s>>>(dst, count, scale, seed); break;
    case DType::fp16: fill_random_kernel<2><<<grid, 256, 0, s>>>(dst, count, scale, seed); break;
    case DType::fp8_e4m3: fill_random_kernel<3><<<grid, 256, 0, s>>>(dst, count, scale, seed); break;
    case DType::fp8_e5m2: fill_random_kernel<4><<<grid, 256, 0, s>>>(dst, count, scale, seed); break;
    default: fail("fill_random: dtype ", dtype_name(dtype), " is not an element type");
  }
  MSA_CUDA_CHECK_LAUNCH();
}

void fill_nvfp4(void* base, std::int64_t bytes, std::int64_t page_stride, int num_kv_heads,
                std::uint64_t seed, cuda::Stream stream) {
  if (bytes <= 0) return;
  MSA_CHECK(page_stride > 0, "fill_nvfp4: page_stride = ", page_stride, " must be positive");
  const std::int64_t page_bytes = 2 * std::int64_t(num_kv_heads) * nvfp4::kSlotBytes;
  fill_nvfp4_kernel<<<grid_for(bytes), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<std::uint8_t*>(base), bytes, page_stride, page_bytes, seed);
  MSA_CUDA_CHECK_LAUNCH();
}

void fill_int32(std::int32_t* dst, std::int64_t count, std::int32_t value, cuda::Stream stream) {
  if (count <= 0) return;
  fill_int32_kernel<<<grid_for(count), 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, count, value);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::tool
