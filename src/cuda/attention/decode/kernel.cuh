// The row attention kernel, query-major: a CTA of 4 warps owns one (token, KV
// head, split): the G query heads of that token (rows padded to 16) against
// the keys of its share of the row's selected blocks. Assembled from the tile
// scheduler and top-k scan (decode/scheduler.cuh), the tile loads
// (mma_sync/load.cuh), the mainloop (mma_sync/mainloop.cuh) and the epilogue
// (decode/epilogue.cuh). Loads are triple-buffered: blocks i + 1 and i + 2
// are in flight while block i is computed. fp8 and nvfp4 blocks are read as
// stored and converted in registers (fp8_fragments.hpp, fp4_fragments.hpp).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/decode/scheduler.cuh"
#include "cuda/attention/decode/epilogue.cuh"
#include "cuda/attention/mma_sync/mainloop.cuh"
#include "cuda/attention/decode/query.cuh"
#include "cuda/attention/format.cuh"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/mma_sync/load.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/common/check.cuh"

namespace msa::cuda::attention {

// kPushes: the instance may merge cluster splits by pushes (decode/push.cuh);
// fp8 has one that does and one that does not (launch_attend). kWide: a
// pushing instance whose owners merge few items four threads an item
// (push_merge), for launches where every owner has few (wide_merge).
template <KvKind kKind, bool kF16, bool kPushes = kv_format(kKind).row_push_merge, bool kWide = false>
__global__ void __launch_bounds__(kThreads, kv_format(kKind).row_ctas_per_sm)
    attend_kernel(const __grid_constant__ AttendParams p) {
  using L = RowLayout<kKind>;
  static_assert(!L::kWidened, "the row kernel reads raw stages");
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  RowWork w = row_of_cta(p, p.cta_offset + blockIdx.x);

  auto* s_ids = reinterpret_cast<std::int32_t*>(smem + L::kIds);
  auto* s_pages = reinterpret_cast<std::int32_t*>(smem + L::kPages);
  auto* s_blocks = reinterpret_cast<std::int32_t*>(smem + L::kBlocks);
  auto* s_count = reinterpret_cast<std::int32_t*>(smem + L::kCount);  // [count, last, position, request]
  // The query loads go out first: their round trip overlaps the scan's two.
  RowQuery<kKind> query;
  query.load(p, w, tid);
  if (row_pushes<kKind, kPushes>(p, w)) push_init(smem_u32(smem + L::kPush), p.group, w.split, w.splits, tid);
  if (warp == 0) {
    const int n = scan_row(p, w, lane, s_ids, s_pages, s_blocks);
    if (lane == 0) {
      s_count[0] = n;
      s_count[2] = w.position;
      s_count[3] = w.request;
    }
  }
  const Stager<kKind, kF16, L, kThreads, true> stager{smem, p, w.head, tid};
  query.store<kF16>(p, smem + L::kQ, reinterpret_cast<float*>(smem + L::kQScale), tid);
  __syncthreads();
  w.position = s_count[2];
  w.request = s_count[3];
  // The score scale of the thread's rows lane / 4 and lane / 4 + 8 (times the
  // rows' query factors where the query tile is scaled, RowQuery).
  float row_scale[2] = {p.score_scale_log2, p.score_scale_log2};
  if constexpr (RowQuery<kKind>::template scaled<kF16>()) {
    const auto* q_scale = reinterpret_cast<const float*>(smem + L::kQScale);
    row_scale[0] *= q_scale[lane >> 2];
    row_scale[1] *= q_scale[(lane >> 2) + 8];
  }

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

  // kStages blocks in flight. One commit group per block (empty past the
  // end), so that "block i landed" is always "at most kStages - 1 pending".
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < count) stager.issue(s, s_pages[begin + s], valid_keys(s));
    cp_async_commit();
  }
  for (int i = 0; i < count; ++i) {
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = i % kStages;
    const int valid = valid_keys(i);
    Format<kKind>::RowBlock::template attend<kKind, kF16>(st, qf, stager, stage, warp, lane, row_scale, valid, p);
    __syncthreads();
    if (i + kStages < count) stager.issue(stage, s_pages[begin + i + kStages], valid_keys(i + kStages));
    cp_async_commit();
  }
  cp_async_wait<0>();
  write_row<kKind, kv_format(kKind).row_dims, kPushes, kWide>(p, w, st, smem, tid);
}

// Clusters of `size` row-kernel CTAs that fit on device `device` at once
// (sizes 2..kMaxClusterSplits, devices 0..63), measured by prepare_attend.
template <KvKind kKind, bool kF16>
int& cluster_capacity(int device, int size) {
  static int capacity[64][kMaxClusterSplits + 1] = {};
  return capacity[device][size];
}

// Whether a launch's cluster splits push: a cluster launch without per-token
// scales (the raw fp8 kinds' receive area lies over them, RowLayout).
inline bool launch_pushes(const AttendParams& p) { return p.cluster_splits > 1 && p.cache.k_scales == nullptr; }

// Whether a pushing launch runs the wide-merge instance: its owners (the
// launch's class of rows splits cluster_splits ways) hold at most a quarter as
// many items as threads (8 splits of 16 heads), where the owner's merge on
// one warp is the step's tail.
inline bool wide_merge(const AttendParams& p) {
  return launch_pushes(p) && four_threads_an_item(p.group, p.cluster_splits);
}

// The kernel instance of a launch: fp8 pushes in one instance and not in the
// other, so that its launches without pushes keep the code they had before;
// the pushing instances have a wide-merge twin (wide_merge).
template <KvKind kKind, bool kF16>
void (*row_kernel(bool pushes, bool wide = false))(AttendParams) {
  if constexpr (kv_format(kKind).fp8) {
    if (!pushes) return attend_kernel<kKind, kF16, false>;
    return wide ? attend_kernel<kKind, kF16, true, true> : attend_kernel<kKind, kF16, true>;
  } else {
    return wide ? attend_kernel<kKind, kF16, kv_format(kKind).row_push_merge, true> : attend_kernel<kKind, kF16>;
  }
}

// Raises the kernel's dynamic shared-memory limit and measures its cluster
// capacities (those of the pushing instance, whose shared memory is the
// larger), once per device (called by the plan, outside any graph capture,
// and again harmlessly by the launch).
template <KvKind kKind, bool kF16>
void prepare_attend() {
  static std::atomic<std::uint64_t> done{0};
  once_per_device(done, [](int device) {
    for (const bool pushes : {false, true})
      for (const bool wide : {false, true})
        MSA_CUDA_CHECK(cudaFuncSetAttribute(row_kernel<kKind, kF16>(pushes, wide),
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, RowLayout<kKind>::kBytes));
    if (device >= 64) return;  // no cluster merge (capacity unknown)
    for (int size = 2; size <= kMaxClusterSplits; ++size) {
      cudaLaunchAttribute cluster;
      const cudaLaunchConfig_t config = cluster_launch_config(
          static_cast<unsigned>(size), kThreads, RowLayout<kKind>::kBytes, static_cast<unsigned>(size), nullptr, cluster);
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, row_kernel<kKind, kF16>(true), &config) != cudaSuccess) {
        (void)cudaGetLastError();  // cluster launches unavailable: merge through the workspace
        clusters = 0;
      }
      cluster_capacity<kKind, kF16>(device, size) = clusters;
    }
  });
}

// Clusters of `size` CTAs (2..kMaxClusterSplits) of the row kernel that the
// current device holds at once; 0 when cluster launches are unavailable.
template <KvKind kKind, bool kF16>
int row_cluster_capacity(int size) {
  prepare_attend<kKind, kF16>();
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= 64 || size < 2 || size > kMaxClusterSplits) return 0;
  return cluster_capacity<kKind, kF16>(device, size);
}

// Shared memory of a launch: the raw fp8 kinds' push area runs past their
// layout (RowLayout), needed only by a cluster launch without per-token scales
// (row_pushes); the others leave it out, for the L1 cache.
template <KvKind kKind>
std::size_t row_smem_bytes(const AttendParams& p) {
  return std::size_t(RowLayout<kKind>::kBytes - (launch_pushes(p) ? 0 : RowLayout<kKind>::kPushTail));
}

// Launches the kernel over `ctas` CTAs (row-kernel CTAs p.cta_offset onwards,
// see row_of_cta), in clusters of p.cluster_splits when that is > 1 (the
// schedule asks for clusters only when all of them fit on the device at once;
// otherwise the splits merge through the workspace).
template <KvKind kKind, bool kF16>
void launch_attend(const AttendParams& p, std::int64_t ctas, cudaStream_t stream) {
  prepare_attend<kKind, kF16>();
  if (p.cluster_splits > 1) {
    cudaLaunchAttribute cluster;
    const cudaLaunchConfig_t config =
        cluster_launch_config(static_cast<unsigned>(ctas), kThreads, row_smem_bytes<kKind>(p),
                              static_cast<unsigned>(p.cluster_splits), stream, cluster);
    MSA_CUDA_CHECK(cudaLaunchKernelEx(&config, row_kernel<kKind, kF16>(launch_pushes(p), wide_merge(p)), p));
  } else {
    AttendParams q = p;
    q.cluster_splits = 0;
    row_kernel<kKind, kF16>(false)<<<dim3(static_cast<unsigned>(ctas)), dim3(kThreads), row_smem_bytes<kKind>(q),
                                     stream>>>(q);
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
