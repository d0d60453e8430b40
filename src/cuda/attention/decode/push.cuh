// Split merge of the row kernel by pushes inside a thread-block cluster whose
// CTAs are one row's splits (cluster rank = split). CTA k owns the (head,
// 8-dim chunk) items i with i % splits == k. Each split stores its normalised
// fp32 partial of every item, and its lse per head, straight into the owner's
// shared memory with st.async, which completes bytes on the owner's mbarrier;
// an owner waits for its own barrier only, merges its items and exits. No
// cluster barrier after the mainloop: a split that finishes early pushes and
// leaves, and the owner's wait is the only wait for the slowest split.
//
// At kernel start every CTA initialises its barrier with the bytes it will
// receive, then arrives on the cluster barrier; a CTA waits on that barrier
// before its first push (long passed by then), so that no push lands before
// the owner's barrier exists.
#pragma once

#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/decode/combine.cuh"
#include "cuda/attention/decode/scheduler.cuh"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// Whether the row's splits merge inside a thread-block cluster (by pushes,
// or for the raw fp8 kinds with per-token scales by pulls, decode/combine.cuh):
// more than one split, launched as a cluster.
__device__ __forceinline__ bool cluster_merged(const AttendParams& p, const RowWork& w) {
  return w.splits > 1 && p.cluster_splits > 1;
}

// Whether the row's splits merge by pushes: a cluster, in a kernel instance
// that pushes (kPushes), on a format with a receive area; the raw fp8 kinds'
// overlays the per-token scales (RowLayout), so those push only without
// them, in an instance of their own (launch_attend), and pull otherwise.
template <KvKind kKind, bool kPushes>
__device__ __forceinline__ bool row_pushes(const AttendParams& p, const RowWork& w) {
  return kPushes && cluster_merged(p, w) && (kv_format(kKind).row_push_merge || p.cache.k_scales == nullptr);
}

// Items (of `chunks`) that split `split` of `splits` owns.
__host__ __device__ __forceinline__ int owned_items(int chunks, int split, int splits) {
  return (chunks - split + splits - 1) / splits;
}

// Whether every owner of a row of `group` heads split `splits` ways holds at
// most a quarter as many items as threads (split 0 owns the most), so that
// four threads can share each item (push_merge's kWide form).
__host__ __device__ __forceinline__ bool four_threads_an_item(int group, int splits) {
  return 4 * owned_items(group * 16, 0, splits) <= kThreads;
}

// The shared::cluster address of `local` (a shared::cta address) in CTA `rank`.
__device__ __forceinline__ std::uint32_t cluster_address(std::uint32_t local, int rank) {
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

// Kernel start, every thread: the barrier expects every byte this CTA will
// receive; then this thread arrives on the cluster barrier.
//   area: shared::cta address of this CTA's PushArea
__device__ __forceinline__ void push_init(std::uint32_t area, int group, int split, int splits, int tid) {
  if (tid == 0) {
    const int chunks = group * 16;
    const std::uint32_t bytes = std::uint32_t(owned_items(chunks, split, splits) * splits * 32 + splits * group * 4);
    sm90::mbar_init(area + PushArea::kBar, 1);
    sm90::mbar_arrive_expect_tx(area + PushArea::kBar, bytes);
    sm90::mbar_init_fence();
  }
  // Relaxed: a release arrive would wait for this thread's loads in flight
  // (the query tile's); the barrier's initialisation is released by the fence.
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
}

// Before the first push, every thread: every CTA of the cluster has set up its barrier.
__device__ __forceinline__ void push_ready() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

// Stores 16 bytes at shared::cluster address `dst`, completing them on the
// mbarrier at shared::cluster address `bar` (same CTA as dst).
__device__ __forceinline__ void push16(std::uint32_t dst, float4 v, std::uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(dst),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void push4(std::uint32_t dst, float v, std::uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n" ::"r"(dst), "f"(v),
               "r"(bar)
               : "memory");
}

// Pushes this split's normalised chunk `part` ([8] floats) of item i = head
// row * 16 + c to its owner, and, when c < splits, the head's lse to owner c.
__device__ __forceinline__ void push_item(std::uint32_t area, int i, int split, int splits, const float (&part)[8],
                                          float lse) {
  const int owner = i % splits, j = i / splits, row = i >> 4, c = i & 15;
  const std::uint32_t bar = cluster_address(area + PushArea::kBar, owner);
  const std::uint32_t dst = cluster_address(area + PushArea::kData + (j * splits + split) * 32, owner);
  push16(dst, make_float4(part[0], part[1], part[2], part[3]), bar);
  push16(dst + 16, make_float4(part[4], part[5], part[6], part[7]), bar);
  if (c < splits) {
    push4(cluster_address(area + PushArea::kLse + (split * kRows + row) * 4, c), lse,
          cluster_address(area + PushArea::kBar, c));
  }
}

// The owner's side, every thread: waits until every split's pushes landed,
// then merges its items into the output and lse (decode/combine.cuh's
// merge_splits; every load of an item issued before any is used).
// kWide: where the owner has at most a quarter as many items as threads,
// four threads share each item (two dims a thread), for a shorter tail.
//   recv: this CTA's PushArea (generic pointer)
template <bool kWide = false>
__device__ __forceinline__ void push_merge(const AttendParams& p, const RowWork& w, const unsigned char* recv,
                                           int tid) {
  sm90::mbar_wait_cluster<0>(smem_u32(recv + PushArea::kBar));
  const int group = p.group, splits = w.splits;
  const auto* data = reinterpret_cast<const float*>(recv + PushArea::kData);
  const auto* lse_of = reinterpret_cast<const float*>(recv + PushArea::kLse);
  const std::int64_t first_head = std::int64_t(w.token) * p.num_q_heads + std::int64_t(w.head) * group;
  const int items = owned_items(group * 16, w.split, splits);
  if constexpr (kWide) {
    if (four_threads_an_item(group, splits)) {
      const int j = tid >> 2, h = tid & 3;
      if (j < items) {
        const int i = w.split + j * splits, g = i >> 4, c = i & 15;
        merge_splits<2>(
            p, first_head + g, c, h, splits, [&](int s) { return data + (j * splits + s) * 8 + 2 * h; },
            [&](int s) { return lse_of[s * kRows + g]; });
      }
      return;
    }
  }
  for (int j = tid; j < items; j += kThreads) {
    const int i = w.split + j * splits, g = i >> 4, c = i & 15;
    merge_splits<8>(
        p, first_head + g, c, 0, splits, [&](int s) { return data + (j * splits + s) * 8; },
        [&](int s) { return lse_of[s * kRows + g]; });
  }
}

}  // namespace msa::cuda::attention
