// (d) The lse-weighted merge of the ranks' partial attention results, as
// msa::cp::merge_partials: out = sum_r w_r out_r with w_r = exp(lse_r - M) /
// sum_s exp(lse_s - M), M = max_r lse_r, lse = M + log(sum_s exp(lse_s - M)).
// A rank whose weight is 0 (lse -inf, or far below the others) is skipped, so
// whatever its output holds never reaches the result. One warp per row, four
// dims per lane.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/cp/cp_device.cuh"
#include "msa/common.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"

namespace msa::cuda::cp {
namespace {

using detail::kWarps;

enum class Kind : int { f32, bf16, fp16 };

struct PartialParams {
  const void* in = nullptr;    // [num_ranks, rows, 128] in_kind
  const float* in_lse = nullptr;  // [num_ranks, rows]
  void* out = nullptr;         // [rows, 128] out_kind
  float* lse = nullptr;        // [rows] or null
  Kind in_kind = Kind::f32;
  Kind out_kind = Kind::f32;
  std::int32_t num_ranks = 0;
  std::int64_t rows = 0;
};

// Elements [i, i + 4) of a 16-bit or 32-bit array as floats.
__device__ __forceinline__ float4 load4(const void* base, Kind kind, std::int64_t i) {
  if (kind == Kind::f32) return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
  const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(base) + i);
  float2 a, b;
  if (kind == Kind::bf16) {
    a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
    b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
  } else {
    a = __half22float2(*reinterpret_cast<const __half2*>(&w.x));
    b = __half22float2(*reinterpret_cast<const __half2*>(&w.y));
  }
  return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ void store4(void* base, Kind kind, std::int64_t i, float4 v) {
  if (kind == Kind::f32) {
    *reinterpret_cast<float4*>(static_cast<float*>(base) + i) = v;
    return;
  }
  uint2 w;
  if (kind == Kind::bf16) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    w.x = *reinterpret_cast<const std::uint32_t*>(&a);
    w.y = *reinterpret_cast<const std::uint32_t*>(&b);
  } else {
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    w.x = *reinterpret_cast<const std::uint32_t*>(&a);
    w.y = *reinterpret_cast<const std::uint32_t*>(&b);
  }
  *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(base) + i) = w;
}

__global__ void __launch_bounds__(kWarps * 32) partials_kernel(const PartialParams p) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  float mx = -INFINITY;
  for (std::int32_t r = 0; r < p.num_ranks; ++r) mx = fmaxf(mx, p.in_lse[r * p.rows + row]);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float lse = -INFINITY;
  if (mx != -INFINITY) {
    float total = 0.0f;
    for (std::int32_t r = 0; r < p.num_ranks; ++r) total += expf(p.in_lse[r * p.rows + row] - mx);
    const float inv = 1.0f / total;
    for (std::int32_t r = 0; r < p.num_ranks; ++r) {
      const float w = expf(p.in_lse[r * p.rows + row] - mx) * inv;
      if (w == 0.0f) continue;
      const float4 o = load4(p.in, p.in_kind, (r * p.rows + row) * kHeadDim + 4 * lane);
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
    lse = mx + logf(total);
  }
  store4(p.out, p.out_kind, row * kHeadDim + 4 * lane, acc);
  if (lane == 0 && p.lse != nullptr) p.lse[row] = lse;
}

Kind kind_of(DType t, const char* what) {
  switch (t) {
    case DType::f32: return Kind::f32;
    case DType::bf16: return Kind::bf16;
    case DType::fp16: return Kind::fp16;
    default: break;
  }
  fail("cp::merge_partials: ", what, " = ", dtype_name(t), " but only f32, bf16 and fp16 are supported");
}

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void merge_partials(const void* partial_out, const float* partial_lse, DType dtype,
                    std::int32_t num_ranks, std::int64_t rows, void* out, DType out_dtype,
                    float* lse, Stream stream) {
  const char* fn = "cp::merge_partials";
  PartialParams p;
  p.in_kind = kind_of(dtype, "dtype");
  p.out_kind = kind_of(out_dtype, "out_dtype");
  MSA_CHECK(num_ranks >= 1, fn, ": num_ranks = ", num_ranks, " must be >= 1");
  MSA_CHECK(rows >= 0, fn, ": rows = ", rows, " is negative");
  if (rows == 0) return;
  MSA_CHECK(partial_out != nullptr && partial_lse != nullptr && out != nullptr, fn,
            ": partial_out / partial_lse / out is null");
  MSA_CHECK(aligned16(partial_out) && aligned16(out), fn,
            ": partial_out and out must be 16-byte aligned");
  p.in = partial_out;
  p.in_lse = partial_lse;
  p.out = out;
  p.lse = lse;
  p.num_ranks = num_ranks;
  p.rows = rows;
  const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps));
  partials_kernel<<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::cp
