// Split-K merge of one (token, query head) row, run by the last CTA of the row
// to finish: out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M),
// lse = M + log(sum_s exp(lse_s - M)) with M = max_s lse_s; a row whose splits
// are all empty writes 0 and -inf. The partials were written by other CTAs, so
// they are read through L2 (__ldcg), never a stale L1 line.
#pragma once

#include <cstdint>

#include "cuda/attention/params.cuh"
#include "cuda/attention/ptx.cuh"

namespace msa::cuda::attention {

// One warp merges row (token, qh); lane owns dims [4 lane, 4 lane + 4).
__device__ __forceinline__ void combine_row(const AttendParams& p, std::int64_t token, std::int64_t qh,
                                            int splits, int lane) {
  const std::int64_t first = (token * p.num_q_heads + qh) * p.max_splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(p.partial_lse + first + s));
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float sum = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float l = __ldcg(p.partial_lse + first + s);
      if (l == -INFINITY) continue;
      const float wgt = expf(l - mx);
      sum += wgt;
      const float4 o = __ldcg(reinterpret_cast<const float4*>(p.partial_out + (first + s) * kDim) + lane);
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

}  // namespace msa::cuda::attention
