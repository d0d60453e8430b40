// Epilogue of the row attention kernel: the four warps leave their
// online-softmax states in shared memory, and one pass merges them per (row,
// 8-dim chunk) into the final output and lse (one split), or into this
// split's normalised fp32 partial and lse: pushed into the shared memory of
// the split that owns the item when the row's splits are a thread-block
// cluster (decode/push.cuh; raw fp8 kinds with per-token scales, whose
// receive area those scales take, leave it in their own for the cluster to
// read, decode/combine.cuh), otherwise in the workspace, where the last split
// of the row to finish merges all of them. A row with no visible key writes 0
// and lse -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/decode/combine.cuh"
#include "cuda/attention/decode/scheduler.cuh"
#include "cuda/attention/mma_sync/mainloop.cuh"
#include "cuda/attention/decode/push.cuh"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

// One CTA's four warp states, as the epilogue leaves them in shared memory:
// per warp v and row r the running max (log2 units, -inf: no key seen), the
// sum of exponentials, and the unnormalised output in natural dim order.
struct WarpStates {
  const float* max;  // [4][16]
  const float* sum;  // [4][16]
  const float* out;  // [4][16][kMergeStride]
};

// One (row, 8-dim chunk c) merged over this CTA's four warp states, every
// load issued before any is used. With M the largest max and
// w_v = exp2(max_v - M), acc = sum_v w_v out_v (unnormalised); returns M and
// L = sum_v w_v sum_v. A warp that saw no key has weight 0; so has every
// warp when none saw a key (M = -inf, L = 0). The chunk's two 16-byte halves
// are read in an order that depends on c, so that the eight threads of each
// shared-memory wavefront hit distinct banks.
__device__ __forceinline__ float2 merge_warps(const WarpStates& st, int row, int c, float (&acc)[8]) {
  const int h = (c >> 2) & 1;
  float m[4], l[4];
  float4 a[4], b[4];
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    m[v] = st.max[v * kRows + row];
    l[v] = st.sum[v * kRows + row];
    const float* o = st.out + (v * kRows + row) * kMergeStride + 8 * c;
    a[v] = *reinterpret_cast<const float4*>(o + 4 * h);
    b[v] = *reinterpret_cast<const float4*>(o + 4 - 4 * h);
  }
  const float mx = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
  float lo[4] = {0.0f, 0.0f, 0.0f, 0.0f}, hi[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float sum = 0.0f;
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const float wgt = m[v] == -INFINITY ? 0.0f : exp2f(m[v] - mx);
    sum += wgt * l[v];
    lo[0] += wgt * a[v].x, lo[1] += wgt * a[v].y, lo[2] += wgt * a[v].z, lo[3] += wgt * a[v].w;
    hi[0] += wgt * b[v].x, hi[1] += wgt * b[v].y, hi[2] += wgt * b[v].z, hi[3] += wgt * b[v].w;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    acc[e] = h ? hi[e] : lo[e];
    acc[e + 4] = h ? lo[e] : hi[e];
  }
  return make_float2(mx, sum);
}

// The lse (natural log) of merge_warps's (M, L); -inf when L = 0.
__device__ __forceinline__ float merged_lse(float2 max_sum) {
  return max_sum.y > 0.0f ? (max_sum.x + log2f(max_sum.y)) * kLn2 : -INFINITY;
}

// Call after the mainloop's last __syncthreads (the stage area is free).
// kDims: which dims st.o's n-tiles hold (natural; the raw fp8 path's
// fp8f::out_dim; the raw nvfp4 path's fp4f::out_dim); kPushes: the kernel
// instance may merge its cluster splits by pushes (row_pushes); kWide: its
// owners merge few items four threads an item (push_merge).
template <KvKind kKind, RowDims kDims = RowDims::natural, bool kPushes = kv_format(kKind).row_push_merge,
          bool kWide = false>
__device__ __forceinline__ void write_row(const AttendParams& p, const RowWork& w, WarpState& st,
                                          unsigned char* smem, int tid) {
  using L = RowLayout<kKind>;
  const int warp = tid >> 5, lane = tid & 31;
  auto* warp_max = reinterpret_cast<float*>(smem + L::kWarpMax);  // [4][16]
  auto* warp_sum = reinterpret_cast<float*>(smem + L::kWarpSum);  // [4][16]
  auto* merged = reinterpret_cast<float*>(smem + L::kStage);      // [4][16][kMergeStride]

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
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = r0 + 8 * i;
    if constexpr (kDims == RowDims::fp4) {
      // n-tiles 4c + e, columns 2q + h: dims 32 c + 8 q + 4 h + e.
      float* dst = merged + (warp * kRows + row) * kMergeStride + 8 * (lane & 3);
#pragma unroll
      for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float4*>(dst + 32 * c + 4 * h) = make_float4(
              st.o[4 * c][2 * i + h], st.o[4 * c + 1][2 * i + h], st.o[4 * c + 2][2 * i + h], st.o[4 * c + 3][2 * i + h]);
    } else if constexpr (kDims == RowDims::fp8) {
      // n-tiles 2j (even dims) and 2j + 1 (odd): dims 16 j + 4 q .. 16 j + 4 q + 3.
      float* dst = merged + (warp * kRows + row) * kMergeStride + 4 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float4*>(dst + 16 * j) = make_float4(st.o[2 * j][2 * i], st.o[2 * j + 1][2 * i],
                                                               st.o[2 * j][2 * i + 1], st.o[2 * j + 1][2 * i + 1]);
    } else {
      float* dst = merged + (warp * kRows + row) * kMergeStride + 2 * (lane & 3);
#pragma unroll
      for (int n = 0; n < 16; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(st.o[n][2 * i], st.o[n][2 * i + 1]);
    }
  }
  const std::int64_t first_head = std::int64_t(w.token) * p.num_q_heads + std::int64_t(w.head) * p.group;
  const int chunks = p.group * 16;  // (row, 8-dim chunk) items
  const bool cluster = cluster_merged(p, w);
  const bool push = row_pushes<kKind, kPushes>(p, w);  // else a cluster pulls (raw fp8 with per-token scales)
  const std::uint32_t push_area = smem_u32(smem + L::kPush);

  // A split's partial: [16][128] and [16] in shared memory after the warp
  // outputs (cluster), or its slot of the workspace.
  float* part = merged + 4 * kRows * kMergeStride;
  float* part_lse = part + kRows * kDim;
  const WarpStates states{warp_max, warp_sum, merged};
  __syncthreads();
  if (push) push_ready();
  // Two items per pass, both merged before either is stored, in a loop
  // without per-item branches (one loop per destination), so that the two
  // items' latency chains overlap: the epilogue runs one warp per scheduler.
  // A thread past the last item repeats its first one and does not store it.
  auto merge_items = [&](auto&& emit) {
#pragma unroll 1
    for (int i = tid; i < chunks; i += 2 * kThreads) {
      const bool two = i + kThreads < chunks;
      const int i2 = two ? i + kThreads : i;
      float acc0[8], acc1[8];
      const float2 ms0 = merge_warps(states, i >> 4, i & 15, acc0);
      const float2 ms1 = merge_warps(states, i2 >> 4, i2 & 15, acc1);
      emit(i, acc0, ms0);
      if (two) emit(i2, acc1, ms1);
    }
  };
  auto factor = [&](float2 ms) { return ms.y > 0.0f ? __fdividef(p.out_scale, ms.y) : 0.0f; };  // ms.y >= 1
  if (w.splits == 1) {
    merge_items([&](int i, float (&acc)[8], float2 ms) {
      const int row = i >> 4, c = i & 15;
      store_chunk(p, first_head + row, c, acc, factor(ms));
      if (c == 0 && p.lse != nullptr) p.lse[first_head + row] = merged_lse(ms);
    });
    return;
  }
  if (push) {
    merge_items([&](int i, float (&acc)[8], float2 ms) {
      const float f = factor(ms);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] *= f;
      push_item(push_area, i, w.split, w.splits, acc, merged_lse(ms));
    });
  } else {
    merge_items([&](int i, float (&acc)[8], float2 ms) {
      const int row = i >> 4, c = i & 15;
      const float f = factor(ms);
      const std::int64_t slot = (first_head + row) * p.max_splits + w.split;
      float* out = (cluster ? part + row * kDim : p.partial_out + slot * kDim) + 8 * c;
      *reinterpret_cast<float4*>(out) = make_float4(acc[0] * f, acc[1] * f, acc[2] * f, acc[3] * f);
      *reinterpret_cast<float4*>(out + 4) = make_float4(acc[4] * f, acc[5] * f, acc[6] * f, acc[7] * f);
      if (c == 0) *(cluster ? part_lse + row : p.partial_lse + slot) = merged_lse(ms);
    });
  }
  if (push) {
    push_merge<kWide>(p, w, smem + L::kPush, tid);
    return;
  }
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
