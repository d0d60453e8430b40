#include "fill.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/check.cuh"
#include "msa/cache.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::tool {

namespace {

__device__ __forceinline__ std::uint64_t hash64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// N(0, 1) from one 64-bit hash (Box-Muller on its two halves).
__device__ __forceinline__ float normal_from(std::uint64_t h) {
  const float u1 = (float(std::uint32_t(h >> 40)) + 1.0f) * (1.0f / 16777217.0f);  // (0, 1]
  const float u2 = float(std::uint32_t(h) & 0xFFFFFFu) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

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

// One thread per 16 values of a row (8 per row): noise * N(0, 1) + amp * the
// sum of the directions of the row's set. Direction element d of group id is
// bit d % 64 of hash(direction_seed, id, d / 64) as a sign.
template <int Tag>  // 1 bf16, 3 e4m3, 5 nvfp4 index rows
__global__ void fill_directed_kernel(void* dst, std::int64_t rows, const std::int64_t* sets, int set_size,
                                     std::int64_t rows_per_set, DirectedFill f) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * 8; i += stride) {
    const std::int64_t row = i >> 3;
    const int g = int(i & 7);  // elements 16g .. 16g + 15
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e)
      x[e] = f.noise * normal_from(hash64(f.noise_seed ^ hash64(std::uint64_t(row * kHeadDim + 16 * g + e))));
    for (int j = 0; sets && j < set_size; ++j) {
      const std::int64_t id = sets[(row / rows_per_set) * set_size + j];
      if (id < 0) continue;
      const std::uint64_t signs = hash64(f.direction_seed ^ hash64(std::uint64_t(id) * 2 + std::uint64_t(g / 4)));
#pragma unroll
      for (int e = 0; e < 16; ++e) x[e] += ((signs >> ((16 * g + e) % 64)) & 1) ? f.amp : -f.amp;
    }
    if constexpr (Tag == 1) {
      auto* out = static_cast<std::uint16_t*>(dst) + row * kHeadDim + 16 * g;
#pragma unroll
      for (int e = 0; e < 16; ++e) out[e] = num::float_to_bf16(x[e]);
    } else if constexpr (Tag == 3) {
      auto* out = static_cast<std::uint8_t*>(dst) + row * kHeadDim + 16 * g;
#pragma unroll
      for (int e = 0; e < 16; ++e) out[e] = num::float_to_e4m3(x[e]);
    } else {
      float amax = 0.0f;
#pragma unroll
      for (int e = 0; e < 16; ++e) amax = fmaxf(amax, fabsf(x[e]));
      const std::uint8_t sf = num::nvfp4_group_scale(amax, 1.0f);
      auto* out = static_cast<std::uint8_t*>(dst) + row * index_nvfp4::kRowBytes;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        out[8 * g + e] = std::uint8_t(num::nvfp4_encode(x[2 * e], sf, 1.0f) | (num::nvfp4_encode(x[2 * e + 1], sf, 1.0f) << 4));
      out[index_nvfp4::kDataBytes + g] = sf;
    }
  }
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

void fill_directed(void* dst, std::int64_t rows, DType dtype, const std::int64_t* sets, int set_size,
                   std::int64_t rows_per_set, const DirectedFill& f, cuda::Stream stream) {
  if (rows <= 0) return;
  MSA_CHECK(rows_per_set >= 1 && set_size >= 0, "fill_directed: rows_per_set = ", rows_per_set, ", set_size = ",
            set_size);
  auto s = static_cast<cudaStream_t>(stream);
  const int grid = grid_for(rows * 8);
  switch (dtype) {
    case DType::bf16: fill_directed_kernel<1><<<grid, 256, 0, s>>>(dst, rows, sets, set_size, rows_per_set, f); break;
    case DType::fp8_e4m3: fill_directed_kernel<3><<<grid, 256, 0, s>>>(dst, rows, sets, set_size, rows_per_set, f); break;
    case DType::nvfp4: fill_directed_kernel<5><<<grid, 256, 0, s>>>(dst, rows, sets, set_size, rows_per_set, f); break;
    default: fail("fill_directed: dtype ", dtype_name(dtype), " is not bf16, fp8_e4m3 or nvfp4");
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::tool
