#include "bench_directed_fill.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/common/check.cuh"
#include "device_random.cuh"
#include "msa/cache.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::tool {

namespace {

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
