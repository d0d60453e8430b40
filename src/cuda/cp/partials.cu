// (d) The lse-weighted merge of the ranks' partial attention results, as
// msa::cp::merge_partials: out = sum_r w_r out_r with w_r = exp(lse_r - M) /
// sum_s exp(lse_s - M), M = max_r lse_r, lse = M + log(sum_s exp(lse_s - M)).
// A rank whose weight is 0 (lse -inf, or far below the others) is skipped, so
// whatever its output holds never reaches the result. One warp per row, four
// dims per lane. (e) and (f) are the same merge cut around a sum over ranks
// (an all-reduce): (e) one rank's term w_r out_r in fp32, (f) the sum in the
// output dtype and the lse.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
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

// The weights of one row: M = max_r lse_r and inv = 1 / sum_r exp(lse_r - M);
// rank r's weight is exp(lse_r - M) * inv. M is -inf when every rank's is.
struct RowWeights {
  float mx = -INFINITY, total = 0.0f, inv = 0.0f;

  __device__ __forceinline__ RowWeights(const float* lse, std::int32_t num_ranks, std::int64_t rows,
                                        std::int64_t row) {
    for (std::int32_t r = 0; r < num_ranks; ++r) mx = fmaxf(mx, lse[r * rows + row]);
    if (mx == -INFINITY) return;
    for (std::int32_t r = 0; r < num_ranks; ++r) total += expf(lse[r * rows + row] - mx);
    inv = 1.0f / total;
  }
  __device__ __forceinline__ bool any() const { return mx != -INFINITY; }
  __device__ __forceinline__ float weight(float lse_r) const { return expf(lse_r - mx) * inv; }
  __device__ __forceinline__ float lse() const { return any() ? mx + logf(total) : -INFINITY; }
};

__global__ void __launch_bounds__(kWarps * 32) partials_kernel(const PartialParams p) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const RowWeights rw(p.in_lse, p.num_ranks, p.rows, row);
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (rw.any()) {
    for (std::int32_t r = 0; r < p.num_ranks; ++r) {
      const float w = rw.weight(p.in_lse[r * p.rows + row]);
      if (w == 0.0f) continue;
      const float4 o = load4(p.in, p.in_kind, (r * p.rows + row) * kHeadDim + 4 * lane);
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
  }
  store4(p.out, p.out_kind, row * kHeadDim + 4 * lane, acc);
  if (lane == 0 && p.lse != nullptr) p.lse[row] = rw.lse();
}

struct WeighParams {
  const void* in = nullptr;       // [rows, 128] in_kind: this rank's rows
  const float* in_lse = nullptr;  // [num_ranks, rows]
  float* out = nullptr;           // [rows, 128]
  Kind in_kind = Kind::f32;
  std::int32_t num_ranks = 0;
  std::int32_t rank = 0;
  std::int64_t rows = 0;
};

// (e): one warp per row, four dims per lane; the rank's term of (d)'s sum.
__global__ void __launch_bounds__(kWarps * 32) weigh_kernel(const WeighParams p) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const RowWeights rw(p.in_lse, p.num_ranks, p.rows, row);
  const float w = rw.any() ? rw.weight(p.in_lse[p.rank * p.rows + row]) : 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (w != 0.0f) {
    const float4 o = load4(p.in, p.in_kind, row * kHeadDim + 4 * lane);
    acc = make_float4(w * o.x, w * o.y, w * o.z, w * o.w);
  }
  store4(p.out, Kind::f32, row * kHeadDim + 4 * lane, acc);
}

// (f): one warp per row; the summed rows in the output dtype and the lse.
__global__ void __launch_bounds__(kWarps * 32) finish_kernel(const PartialParams p) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const RowWeights rw(p.in_lse, p.num_ranks, p.rows, row);
  const float4 v = rw.any() ? load4(p.in, Kind::f32, row * kHeadDim + 4 * lane) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  store4(p.out, p.out_kind, row * kHeadDim + 4 * lane, v);
  if (lane == 0 && p.lse != nullptr) p.lse[row] = rw.lse();
}

Kind kind_of(const char* fn, DType t, const char* what) {
  switch (t) {
    case DType::f32: return Kind::f32;
    case DType::bf16: return Kind::bf16;
    case DType::fp16: return Kind::fp16;
    default: break;
  }
  fail(fn, ": ", what, " = ", dtype_name(t), " but only f32, bf16 and fp16 are supported");
}

// The rank count and rows every merge entry point checks; false when there
// are no rows (nothing to launch).
bool merge_rows(const char* fn, std::int32_t num_ranks, std::int64_t rows) {
  MSA_CHECK(num_ranks >= 1, fn, ": num_ranks = ", num_ranks, " must be >= 1");
  MSA_CHECK(rows >= 0, fn, ": rows = ", rows, " is negative");
  return rows > 0;
}

// One warp per row.
template <class Params>
void launch_rows(void (*kernel)(Params), const Params& p, std::int64_t rows, Stream stream) {
  kernel<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

}  // namespace

void merge_partials(const void* partial_out, const float* partial_lse, DType dtype,
                    std::int32_t num_ranks, std::int64_t rows, void* out, DType out_dtype,
                    float* lse, Stream stream) {
  const char* fn = "cp::merge_partials";
  PartialParams p;
  p.in_kind = kind_of(fn, dtype, "dtype");
  p.out_kind = kind_of(fn, out_dtype, "out_dtype");
  if (!merge_rows(fn, num_ranks, rows)) return;
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
  launch_rows(partials_kernel, p, rows, stream);
}

void weigh_partial(const void* own_out, DType dtype, const float* partial_lse, std::int32_t num_ranks,
                   std::int32_t rank, std::int64_t rows, float* weighted, Stream stream) {
  const char* fn = "cp::weigh_partial";
  WeighParams p;
  p.in_kind = kind_of(fn, dtype, "dtype");
  MSA_CHECK(rank >= 0 && rank < std::max(num_ranks, 1), fn, ": rank = ", rank, " is not in [0, ", num_ranks, ")");
  if (!merge_rows(fn, num_ranks, rows)) return;
  MSA_CHECK(own_out != nullptr && partial_lse != nullptr && weighted != nullptr, fn,
            ": own_out / partial_lse / weighted is null");
  MSA_CHECK(aligned16(own_out) && aligned16(weighted), fn, ": own_out and weighted must be 16-byte aligned");
  p.in = own_out;
  p.in_lse = partial_lse;
  p.out = weighted;
  p.num_ranks = num_ranks;
  p.rank = rank;
  p.rows = rows;
  launch_rows(weigh_kernel, p, rows, stream);
}

void finish_weighted(const float* summed, const float* partial_lse, std::int32_t num_ranks,
                     std::int64_t rows, void* out, DType out_dtype, float* lse, Stream stream) {
  const char* fn = "cp::finish_weighted";
  PartialParams p;
  p.in_kind = Kind::f32;
  p.out_kind = kind_of(fn, out_dtype, "out_dtype");
  if (!merge_rows(fn, num_ranks, rows)) return;
  MSA_CHECK(summed != nullptr && partial_lse != nullptr && out != nullptr, fn,
            ": summed / partial_lse / out is null");
  MSA_CHECK(aligned16(summed) && aligned16(out), fn, ": summed and out must be 16-byte aligned");
  p.in = summed;
  p.in_lse = partial_lse;
  p.out = out;
  p.lse = lse;
  p.num_ranks = num_ranks;
  p.rows = rows;
  launch_rows(finish_kernel, p, rows, stream);
}

}  // namespace msa::cuda::cp
