// The attention kernel, query-major: a CTA of 4 warps owns one (token, KV
// head, split): the G query heads of that token (rows padded to 16) against
// the keys of its share of the row's selected blocks. Assembled from the tile
// scheduler and top-k scan (kernel_entries.cuh), the tile loads
// (kernel_stage.cuh), the mainloop (kernel_mainloop.cuh) and the epilogue
// (kernel_epilogue.cuh). Loads are double-buffered: block i + 1 (and for
// converted kinds i + 2) is in flight while block i is computed.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/attention/kernel_entries.cuh"
#include "cuda/attention/kernel_epilogue.cuh"
#include "cuda/attention/kernel_mainloop.cuh"
#include "cuda/attention/kernel_smem.cuh"
#include "cuda/attention/kernel_stage.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/attention/ptx.cuh"
#include "cuda/common/check.cuh"

namespace msa::cuda::attention {

// Converts 8 query elements (of any query kind) to the MMA type.
//   q: [num_tokens, num_q_heads, 128]; elem: index of the first of the 8
template <bool kF16>
__device__ __forceinline__ uint4 load_query_chunk(const AttendParams& p, std::int64_t elem) {
  if (p.q_kind == kQueryE4m3) {
    const uint2 c = *reinterpret_cast<const uint2*>(static_cast<const unsigned char*>(p.q) + elem);
    return make_uint4(f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.x & 0xffffu))),
                      f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.x >> 16))),
                      f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.y & 0xffffu))),
                      f16x2_to_mma<kF16>(e4m3x2_to_f16x2(std::uint16_t(c.y >> 16))));
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p.q) + elem);
  const bool q_fp16 = p.q_kind == kQueryFp16;
  if (q_fp16 == kF16) return raw;
  // bf16 <-> fp16 through float.
  std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float lo, hi;
    if (q_fp16) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      lo = f.x, hi = f.y;
    } else {
      lo = __uint_as_float(w[i] << 16), hi = __uint_as_float(w[i] & 0xffff0000u);
    }
    w[i] = pack2<kF16>(lo, hi);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The CTA's query rows into the swizzled query tile; rows >= G are zero.
template <bool kF16>
__device__ __forceinline__ void stage_query(const AttendParams& p, const RowWork& w,
                                            unsigned char* q_tile, int tid) {
#pragma unroll
  for (int it = 0; it < kRows * 16 / kThreads; ++it) {
    const int idx = tid + it * kThreads;
    const int row = idx >> 4, c = idx & 15;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < p.group && w.position >= 0) {
      const std::int64_t qh = std::int64_t(w.head) * p.group + row;
      v = load_query_chunk<kF16>(p, (std::int64_t(w.token) * p.num_q_heads + qh) * kDim + 8 * c);
    }
    *reinterpret_cast<uint4*>(q_tile + tile_offset(row, c)) = v;
  }
}

template <KvKind kKind, bool kF16>
__global__ void __launch_bounds__(kThreads, 1) attend_kernel(const __grid_constant__ AttendParams p) {
  using L = SmemLayout<kKind>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const RowWork w = row_of_cta(p, blockIdx.x);

  auto* s_ids = reinterpret_cast<std::int32_t*>(smem + L::kIds);
  auto* s_pages = reinterpret_cast<std::int32_t*>(smem + L::kPages);
  auto* s_blocks = reinterpret_cast<std::int32_t*>(smem + L::kBlocks);
  auto* s_count = reinterpret_cast<std::int32_t*>(smem + L::kCount);
  if (warp == 0) {
    const int n = scan_topk(p, w, lane, s_ids, s_pages, s_blocks);
    if (lane == 0) s_count[0] = n;
  }
  const Stager<kKind, kF16> stager{smem, p, w.head, tid};
  stager.build_lut();
  stage_query<kF16>(p, w, smem + L::kQ, tid);
  __syncthreads();

  std::uint32_t qf[8][4];
  load_query_fragments(qf, smem_u32(smem + L::kQ), lane);
  WarpState st;
  st.init();

  const int n = s_count[0];
  const int begin = int(std::int64_t(w.split) * n / w.splits);
  const int count = int(std::int64_t(w.split + 1) * n / w.splits) - begin;
  // Keys of block i visible to the row: those <= p.
  auto valid_keys = [&](int i) {
    const int v = w.position - s_blocks[begin + i] * kBlockKeys + 1;
    return v < kBlockKeys ? v : kBlockKeys;
  };
  const float* k_scales = stager.k_token_scales();
  const float* v_scales = stager.v_token_scales();

  if (count > 0) {
    stager.issue(0, s_pages[begin], valid_keys(0));
    cp_async_commit();
  }
  if (count > 1) {
    stager.issue(1, s_pages[begin + 1], valid_keys(1));
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    if (i + 1 < count) cp_async_wait<1>();
    else cp_async_wait<0>();
    __syncthreads();
    const int stage = i & 1;
    const int valid = valid_keys(i);
    if constexpr (L::kConverted) {
      stager.widen(stage, valid);
      __syncthreads();
      if (i + 2 < count) {
        stager.issue(stage, s_pages[begin + i + 2], valid_keys(i + 2));
        cp_async_commit();
      }
    }
    attend_block<kF16>(st, qf, stager.k_tile(stage), stager.v_tile(stage), warp, lane,
                       p.score_scale_log2, valid, k_scales, v_scales);
    __syncthreads();
    if constexpr (!L::kConverted) {
      if (i + 2 < count) {
        stager.issue(stage, s_pages[begin + i + 2], valid_keys(i + 2));
        cp_async_commit();
      }
    }
  }
  write_row<kKind>(p, w, st, smem, tid);
}

// Raises the kernel's dynamic shared-memory limit, once per device (called by
// the plan, outside any graph capture, and again harmlessly by the launch).
template <KvKind kKind, bool kF16>
void prepare_attend() {
  static std::atomic<std::uint64_t> done{0};  // bit d: device d prepared
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  const std::uint64_t bit = device < 64 ? std::uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return;
  MSA_CUDA_CHECK(cudaFuncSetAttribute(attend_kernel<kKind, kF16>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      SmemLayout<kKind>::kBytes));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// Launches the kernel over `ctas` CTAs (decode CTAs first, see row_of_cta).
template <KvKind kKind, bool kF16>
void launch_attend(const AttendParams& p, std::int64_t ctas, cudaStream_t stream) {
  prepare_attend<kKind, kF16>();
  attend_kernel<kKind, kF16><<<dim3(static_cast<unsigned>(ctas)), dim3(kThreads),
                               SmemLayout<kKind>::kBytes, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
