// Split-K merge of one (token, KV head) row's G query heads. Through the
// workspace, run by the whole CTA of the last split to finish: with M = max_s lse_s,
//   out = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M),
//   lse = M + log(sum_s exp(lse_s - M));
// a head whose splits are all empty writes 0 and -inf. The partials were
// written by other CTAs, so they are read through L2 (__ldcg), never a stale
// L1 line. All loads of one step are independent, so they overlap: one round
// trip for the lse values, then the partial outputs.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/decode/scheduler.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

// Eight merged output values times `inv`, packed to the output type and
// stored as chunk c (dims 8c .. 8c + 7) of query-head row `row` of p.out
// ([num_tokens * num_q_heads, 128]).
__device__ __forceinline__ void store_chunk(const AttendParams& p, std::int64_t row, int c, float (&acc)[8],
                                            float inv) {
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] *= inv;
  uint4 o;
  if (p.out_fp16) {
    o = make_uint4(pack2<true>(acc[0], acc[1]), pack2<true>(acc[2], acc[3]), pack2<true>(acc[4], acc[5]),
                   pack2<true>(acc[6], acc[7]));
  } else {
    o = make_uint4(pack2<false>(acc[0], acc[1]), pack2<false>(acc[2], acc[3]), pack2<false>(acc[4], acc[5]),
                   pack2<false>(acc[6], acc[7]));
  }
  *reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(p.out) + row * kDim + 8 * c) = o;
}

// One (head row, kDims dims) merged over `splits` (<= kMaxClusterSplits)
// splits' normalised partials, stored to p.out: dims 8c + kDims * part ..,
// with the head's lse from the thread of c == 0, part == 0. kDims = 8: a
// whole chunk a thread (part 0); kDims = 2: four threads share chunk c
// (part = 0..3), each chain a quarter as long, for owners with few items.
// values(s): split s's kDims floats (4 * kDims-byte aligned); lse_of(s): its
// lse (-inf: empty). Every load is issued before any is used.
template <int kDims, class Values, class Lse>
__device__ __forceinline__ void merge_splits(const AttendParams& p, std::int64_t row, int c, int part, int splits,
                                             Values values, Lse lse_of) {
  static_assert(kDims == 8 || kDims == 2);
  using Half = std::conditional_t<kDims == 8, float4, float2>;  // the first (or only) half of a split's values
  float lse[kMaxClusterSplits];
  Half a[kMaxClusterSplits];
  float4 b[kMaxClusterSplits];  // kDims = 8: values 4..7
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) {
    lse[s] = -INFINITY;
    if constexpr (kDims == 8) {
      a[s] = b[s] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      a[s] = make_float2(0.0f, 0.0f);
    }
    if (s < splits) {
      const float* src = values(s);
      lse[s] = lse_of(s);
      a[s] = *reinterpret_cast<const Half*>(src);
      if constexpr (kDims == 8) b[s] = *reinterpret_cast<const float4*>(src + 4);
    }
  }
  float mx = -INFINITY;
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) mx = fmaxf(mx, lse[s]);
  float acc[kDims];
#pragma unroll
  for (int e = 0; e < kDims; ++e) acc[e] = 0.0f;
  float sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) {
    const float wgt = (mx == -INFINITY || lse[s] == -INFINITY) ? 0.0f : expf(lse[s] - mx);
    sum += wgt;
    acc[0] += wgt * a[s].x, acc[1] += wgt * a[s].y;
    if constexpr (kDims == 8) {
      acc[2] += wgt * a[s].z, acc[3] += wgt * a[s].w;
      acc[4] += wgt * b[s].x, acc[5] += wgt * b[s].y, acc[6] += wgt * b[s].z, acc[7] += wgt * b[s].w;
    }
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  if constexpr (kDims == 8) {
    store_chunk(p, row, c, acc, inv);
  } else {
    acc[0] *= inv, acc[1] *= inv;
    const std::uint32_t o = p.out_fp16 ? pack2<true>(acc[0], acc[1]) : pack2<false>(acc[0], acc[1]);
    *reinterpret_cast<std::uint32_t*>(static_cast<std::uint16_t*>(p.out) + row * kDim + 8 * c + 2 * part) = o;
  }
  if (c == 0 && part == 0 && p.lse != nullptr) p.lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

//   scratch: shared memory, [16 heads][16 splits] weights then [16] 1 / sum
__device__ __forceinline__ void combine_row(const AttendParams& p, const RowWork& w, float* scratch,
                                            int tid) {
  const int group = p.group, splits = w.splits;
  float* weight = scratch;               // [16][16]
  float* inv_sum = scratch + kRows * 16;  // [16]
  const std::int64_t first_head = std::int64_t(w.token) * p.num_q_heads + std::int64_t(w.head) * group;

  for (int i = tid; i < group * splits; i += kThreads) {
    const int g = i / splits, s = i - g * splits;
    weight[g * 16 + s] = __ldcg(p.partial_lse + (first_head + g) * p.max_splits + s);
  }
  __syncthreads();
  if (tid < group) {
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, weight[tid * 16 + s]);
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float l = weight[tid * 16 + s];
      const float e = (mx == -INFINITY || l == -INFINITY) ? 0.0f : expf(l - mx);
      weight[tid * 16 + s] = e;
      sum += e;
    }
    inv_sum[tid] = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (p.lse != nullptr) p.lse[first_head + tid] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
  }
  __syncthreads();

  // 16 heads x 16 chunks of 8 dims; two chunks per thread.
#pragma unroll
  for (int it = 0; it < 2; ++it) {
    const int idx = tid + it * kThreads;
    const int g = idx >> 4, c = idx & 15;
    if (g >= group) continue;
    const float* src = p.partial_out + (first_head + g) * p.max_splits * kDim + 8 * c;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const float wgt = weight[g * 16 + s];
      const float4 a = __ldcg(reinterpret_cast<const float4*>(src + s * kDim));
      const float4 b = __ldcg(reinterpret_cast<const float4*>(src + s * kDim + 4));
      acc[0] += wgt * a.x, acc[1] += wgt * a.y, acc[2] += wgt * a.z, acc[3] += wgt * a.w;
      acc[4] += wgt * b.x, acc[5] += wgt * b.y, acc[6] += wgt * b.z, acc[7] += wgt * b.w;
    }
    store_chunk(p, first_head + g, c, acc, inv_sum[g]);
  }
}

// The same merge inside a thread-block cluster whose CTAs are the row's
// splits (cluster rank = split), by pulls: the raw fp8 kinds' form with
// per-token scales (every other step pushes, decode/push.cuh). Each CTA left
// its normalised fp32 output and lse in its own shared memory, and CTA k
// merges the (head, 8-dim chunk) items i with i % splits == k, reading every
// split's values through distributed shared memory. All of an item's remote
// loads are issued before any is used (one round trip, not one per split). Two
// cluster barriers: partials complete before any read, no CTA exits (freeing
// its shared memory) before every read is done.
//   part:     this CTA's shared [16 heads][128] fp32 partial output
//   part_lse: this CTA's shared [16] lse (natural log)
__device__ __forceinline__ void cluster_combine_row(const AttendParams& p, const RowWork& w,
                                                    const float* part, const float* part_lse, int tid) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int group = p.group, splits = w.splits;
  const std::int64_t first_head = std::int64_t(w.token) * p.num_q_heads + std::int64_t(w.head) * group;
  for (int i = w.split + tid * splits; i < group * 16; i += kThreads * splits) {
    const int g = i >> 4, c = i & 15;
    merge_splits<8>(
        p, first_head + g, c, 0, splits, [&](int s) { return cluster.map_shared_rank(part, s) + g * kDim + 8 * c; },
        [&](int s) { return cluster.map_shared_rank(part_lse, s)[g]; });
  }
  cluster.sync();
}

}  // namespace msa::cuda::attention
