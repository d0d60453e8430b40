// The key-major attention kernel (bf16 / fp16 caches, sm_90a): each work item
// (key_major.cu) is one block of one request and KV head and the up to T
// tokens of the k2q plan that selected it, T x G = 64 query rows; its rows'
// attention over that block alone goes to the (token, query head, slot)
// partials, which the merge then combines per row.
//
//  - One persistent CTA per SM takes a contiguous run of the items, so that
//    a block's items follow each other and its K / V tiles load once for
//    them (key_major/produce.cuh: the streamer warp, two slots).
//  - Three loader warps bring each item's description and query rows into
//    its Q buffer (six buffers, two per loader, items taken in turn), rows by
//    TMA (one box per token) as soon as the buffer is free: neither the rows
//    nor the K / V wait for each other.
//  - Three consumer warpgroups (key_major/consume.cuh) each run whole items
//    (every third of the run): QK, the one-pass softmax, PV, then the rows
//    staged in their Q buffer and copied out. A warpgroup's softmax and
//    epilogue overlap the other two's MMAs, and its next item's QK runs
//    while its rows go out.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>

#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/attention/key_major/consume.cuh"
#include "cuda/attention/key_major/layout.cuh"
#include "cuda/attention/key_major/produce.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// Runs min(p.tile_count, *p.tile_gate) items of p.km_items.
template <bool kF16>
__global__ void __launch_bounds__(KeyMajorTile::kThreads, 1)
    attend_key_major_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ KvMaps maps) {
  using W = KeyMajorTile;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const KeyMajorBars bar{smem_u32(smem + W::kBars)};
  const std::int64_t n = p.tile_gate != nullptr ? min(p.tile_count, *p.tile_gate) : p.tile_count;
  const KeyMajorRun run = key_major_run(n);
  if (run.end <= run.begin) return;
  if (tid == 0) {
    for (int b = 0; b < W::kQBufs; ++b) {
      sm90::mbar_init(bar.q_full(b), 32);    // its loader warp's lanes
      sm90::mbar_init(bar.q_empty(b), 128);  // its warpgroup's threads
    }
    for (int h = 0; h < W::kLoadBars; ++h) {
      sm90::mbar_init(bar.k_full(h), 1);
      sm90::mbar_init(bar.v_full(h), 1);
    }
    for (int s = 0; s < W::kKvSlots; ++s) sm90::mbar_init(bar.kv_empty(s), W::kKvRelease);
    sm90::mbar_init(bar.tail(), 1);
    sm90::mbar_init_fence();
  }
  __syncthreads();
  if (warp >= W::kStreamerWarp) {
    sm90::regs_dec<W::kProducerRegs>();
    if (warp == W::kStreamerWarp) stream_key_major_blocks(p, maps, smem, bar, run, lane);
    else load_key_major_items<kF16>(p, maps, smem, bar, run, warp - W::kStreamerWarp - 1, lane);
    return;
  }
  sm90::regs_inc<W::kConsumerRegs>();
  consume_key_major_items<kF16>(p, maps, smem, bar, int(run.end - run.begin), sm90::warp_uniform(warp >> 2), warp,
                                lane);
}

template <bool kF16>
void prepare_attend_key_major() {
  static std::atomic<std::uint64_t> done{0};
  raise_smem_limit_once(done, attend_key_major_kernel<kF16>, KeyMajorTile::kBytes);
}

// Launches the key-major work items (p.km_items, at most p.tile_count, the
// device's count behind p.tile_gate) on one persistent CTA per SM.
template <bool kF16>
void launch_attend_key_major(const AttendParams& p, const KvMaps& maps, cudaStream_t stream) {
  prepare_attend_key_major<kF16>();
  const std::int64_t ctas = std::min<std::int64_t>(p.tile_count, std::max(device_sm_count(), 1));
  if (ctas <= 0) return;
  attend_key_major_kernel<kF16>
      <<<dim3(static_cast<unsigned>(ctas)), dim3(KeyMajorTile::kThreads), KeyMajorTile::kBytes, stream>>>(p, maps);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
