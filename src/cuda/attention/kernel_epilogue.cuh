// Epilogue of the attention kernel: merges the four warps' online-softmax
// states through shared memory, then writes either the final output and lse
// (one split) or this split's normalized fp32 partial output and lse: in the
// workspace, where the last split of a row to finish merges all of them, or
// (cluster_splits) in shared memory, merged across the cluster
// (kernel_combine.cuh). A row with no visible key writes 0 and lse -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/kernel_combine.cuh"
#include "cuda/attention/kernel_entries.cuh"
#include "cuda/attention/kernel_mainloop.cuh"
#include "cuda/attention/kernel_smem.cuh"
#include "cuda/attention/ptx.cuh"

namespace msa::cuda::attention {

inline constexpr float kLn2 = 0.6931471805599453f;

// Call after the mainloop's last __syncthreads (the stage area is free).
// kDims: which dims st.o's n-tiles hold (natural; the raw fp8 path's
// fp8f::out_dim; the raw nvfp4 path's fp4f::out_dim).
template <KvKind kKind, RowDims kDims = RowDims::natural>
__device__ __forceinline__ void write_row(const AttendParams& p, const RowWork& w, WarpState& st,
                                          unsigned char* smem, int tid) {
  using L = RowLayout<kKind>;
  const int warp = tid >> 5, lane = tid & 31;
  auto* warp_max = reinterpret_cast<float*>(smem + L::kWarpMax);  // [4][16]
  auto* warp_sum = reinterpret_cast<float*>(smem + L::kWarpSum);  // [4][16]
  auto* row_sum = reinterpret_cast<float*>(smem + L::kRowSum);    // [16]
  auto* merged = reinterpret_cast<float*>(smem + L::kStage);      // [4][16][kMergeStride]
  // Cluster merge: this split's output and lse for the other CTAs of the cluster.
  auto* part = reinterpret_cast<float*>(smem + L::kStage + L::kMergeBytes);  // [16][128]
  float* part_lse = part + kRows * kDim;                                      // [16]
  const bool cluster = w.splits > 1 && p.cluster_splits > 1;

  const int r0 = lane >> 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
  }
  if ((lane & 3) == 0) {
    warp_max[warp * kRows + r0] = st.m[0];
    warp_max[warp * kRows + r0 + 8] = st.m[1];
    warp_sum[warp * kRows + r0] = st.l[0];
    warp_sum[warp * kRows + r0 + 8] = st.l[1];
  }
  __syncthreads();

  if (tid < kRows) {
    float mx = -INFINITY;
#pragma unroll
    for (int v = 0; v < 4; ++v) mx = fmaxf(mx, warp_max[v * kRows + tid]);
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float m = warp_max[v * kRows + tid];
      if (m != -INFINITY) sum += warp_sum[v * kRows + tid] * exp2f(m - mx);
    }
    row_sum[tid] = sum;
    if (tid < p.group) {
      const float lse = sum > 0.0f ? (mx + log2f(sum)) * kLn2 : -INFINITY;
      const std::int64_t qh = std::int64_t(w.head) * p.group + tid;
      if (w.splits == 1) {
        if (p.lse != nullptr) p.lse[std::int64_t(w.token) * p.num_q_heads + qh] = lse;
      } else if (cluster) {
        part_lse[tid] = lse;
      } else {
        p.partial_lse[(std::int64_t(w.token) * p.num_q_heads + qh) * p.max_splits + w.split] = lse;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = r0 + 8 * i;
    float mx = -INFINITY;
#pragma unroll
    for (int v = 0; v < 4; ++v) mx = fmaxf(mx, warp_max[v * kRows + row]);
    const float f = st.m[i] == -INFINITY ? 0.0f : exp2f(st.m[i] - mx);
    if constexpr (kDims == RowDims::fp4) {
      // n-tiles 4c + e, columns 2q + h: dims 32 c + 8 q + 4 h + e.
      float* dst = merged + (warp * kRows + row) * kMergeStride + 8 * (lane & 3);
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float4*>(dst + 32 * c + 4 * h) =
              make_float4(st.o[4 * c][2 * i + h] * f, st.o[4 * c + 1][2 * i + h] * f, st.o[4 * c + 2][2 * i + h] * f,
                          st.o[4 * c + 3][2 * i + h] * f);
    } else if constexpr (kDims == RowDims::fp8) {
      // n-tiles 2j (even dims) and 2j + 1 (odd): dims 16 j + 4 q .. 16 j + 4 q + 3.
      float* dst = merged + (warp * kRows + row) * kMergeStride + 4 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float4*>(dst + 16 * j) = make_float4(st.o[2 * j][2 * i] * f, st.o[2 * j + 1][2 * i] * f,
                                                               st.o[2 * j][2 * i + 1] * f, st.o[2 * j + 1][2 * i + 1] * f);
    } else {
      float* dst = merged + (warp * kRows + row) * kMergeStride + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < 16; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(st.o[n][2 * i] * f, st.o[n][2 * i + 1] * f);
    }
  }
  __syncthreads();

  // 16 rows x 16 chunks of 8 dims; two chunks per thread.
#pragma unroll
  for (int it = 0; it < 2; ++it) {
    const int idx = tid + it * kThreads;
    const int row = idx >> 4, c = idx & 15;
    if (row >= p.group) continue;
    const float sum = row_sum[row];
    const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float* src = merged + (v * kRows + row) * kMergeStride + 8 * c;
      const float4 a = *reinterpret_cast<const float4*>(src);
      const float4 b = *reinterpret_cast<const float4*>(src + 4);
      acc[0] += a.x, acc[1] += a.y, acc[2] += a.z, acc[3] += a.w;
      acc[4] += b.x, acc[5] += b.y, acc[6] += b.z, acc[7] += b.w;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= inv;
    const std::int64_t qh = std::int64_t(w.head) * p.group + row;
    if (w.splits == 1) {
      uint4 o;
      if (p.out_fp16) {
        o = make_uint4(pack2<true>(acc[0], acc[1]), pack2<true>(acc[2], acc[3]),
                       pack2<true>(acc[4], acc[5]), pack2<true>(acc[6], acc[7]));
      } else {
        o = make_uint4(pack2<false>(acc[0], acc[1]), pack2<false>(acc[2], acc[3]),
                       pack2<false>(acc[4], acc[5]), pack2<false>(acc[6], acc[7]));
      }
      auto* out = static_cast<std::uint16_t*>(p.out) + (std::int64_t(w.token) * p.num_q_heads + qh) * kDim;
      *reinterpret_cast<uint4*>(out + 8 * c) = o;
    } else if (cluster) {
      *reinterpret_cast<float4*>(part + row * kDim + 8 * c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(part + row * kDim + 8 * c + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      float* out = p.partial_out +
                   ((std::int64_t(w.token) * p.num_q_heads + qh) * p.max_splits + w.split) * kDim;
      *reinterpret_cast<float4*>(out + 8 * c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      *reinterpret_cast<float4*>(out + 8 * c + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
  }
  if (w.splits == 1) return;
  if (cluster) {
    cluster_combine_row(p, w, part, part_lse, tid);
    return;
  }

  // Split-K: count this split in; the last one of the row merges the partials.
  auto* s_last = reinterpret_cast<int*>(smem + L::kCount) + 1;
  __threadfence();  // this thread's partials are visible device-wide ...
  __syncthreads();  // ... for every thread, before the count goes up
  if (tid == 0) {
    int* counter = p.counters + std::int64_t(w.token) * p.num_kv_heads + w.head;
    const bool last = atomicAdd(counter, 1) == w.splits - 1;
    if (last) atomicExch(counter, 0);  // ready for the next call (graph replays)
    *s_last = last;
  }
  __syncthreads();
  if (!*s_last) return;
  __threadfence();
  combine_row(p, w, merged, tid);  // the merge buffer is free again: scratch
}

}  // namespace msa::cuda::attention
