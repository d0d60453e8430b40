// Combine step of split-K attention: merges the per-split normalized fp32
// outputs with their lse weights, out = sum_s exp(lse_s - M) o_s / sum_s
// exp(lse_s - M), lse = M + log(sum_s exp(lse_s - M)); a row whose splits are
// all empty writes 0 and -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/launch.hpp"
#include "cuda/attention/params.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/common/check.cuh"

namespace msa::cuda::attention {
namespace {

inline constexpr int kCombineWarps = 4;

// One warp per (token, query head); a lane owns 4 dims.
__global__ void __launch_bounds__(kCombineWarps * 32)
    combine_kernel(const __grid_constant__ AttendParams p, int token_begin, int token_end, int splits) {
  const int lane = threadIdx.x & 31;
  const std::int64_t row =
      std::int64_t(blockIdx.x) * kCombineWarps + (threadIdx.x >> 5);  // over (token, head)
  const std::int64_t rows = std::int64_t(token_end - token_begin) * p.num_q_heads;
  if (row >= rows) return;
  const std::int64_t token = token_begin + row / p.num_q_heads;
  const std::int64_t qh = row % p.num_q_heads;
  const std::int64_t first = (token * p.num_q_heads + qh) * p.max_splits;

  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, p.partial_lse[first + s]);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float l = p.partial_lse[first + s];
      if (l == -INFINITY) continue;
      const float wgt = expf(l - mx);
      sum += wgt;
      const float4 o = *reinterpret_cast<const float4*>(p.partial_out + (first + s) * kDim + 4 * lane);
      acc[0] += wgt * o.x, acc[1] += wgt * o.y, acc[2] += wgt * o.z, acc[3] += wgt * o.w;
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const std::int64_t at = (token * p.num_q_heads + qh) * kDim + 4 * lane;
  uint2 o;
  if (p.out_fp16) {
    o = make_uint2(pack2<true>(acc[0] * inv, acc[1] * inv), pack2<true>(acc[2] * inv, acc[3] * inv));
  } else {
    o = make_uint2(pack2<false>(acc[0] * inv, acc[1] * inv), pack2<false>(acc[2] * inv, acc[3] * inv));
  }
  *reinterpret_cast<uint2*>(static_cast<std::uint16_t*>(p.out) + at) = o;
  if (lane == 0 && p.lse != nullptr)
    p.lse[token * p.num_q_heads + qh] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

}  // namespace

void launch_combine(const AttendParams& p, int token_begin, int token_end, int splits,
                    cudaStream_t stream) {
  const std::int64_t rows = std::int64_t(token_end - token_begin) * p.num_q_heads;
  if (rows <= 0) return;
  const std::int64_t ctas = (rows + kCombineWarps - 1) / kCombineWarps;
  combine_kernel<<<dim3(static_cast<unsigned>(ctas)), dim3(kCombineWarps * 32), 0, stream>>>(
      p, token_begin, token_end, splits);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
