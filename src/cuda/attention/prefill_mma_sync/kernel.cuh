// The token-tile attention kernel (prefill): a CTA of 8 warps owns T
// consecutive prefill tokens of one request and one KV head, their T x G query
// rows token-major (row = t * G + g, 16 rows per warp, rows >= T x G unused).
// It loads each block of the union of the tokens' selections once
// (shared/tile_scheduler.cuh, ascending) and every warp attends its rows to the
// keys of the blocks its tokens selected, up to each row's own position; a
// warp none of whose tokens selected a block skips it, and a warp takes a
// block's 128 keys in one pass. A warp owns whole
// rows, so the epilogue is a plain normalisation (no warp merge, no split-K).
// Loads are double-buffered as in the row kernel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/attention/decode/kernel.cuh"
#include "cuda/attention/shared/tile_scheduler.cuh"
#include "cuda/attention/prefill_mma_sync/query.cuh"

namespace msa::cuda::attention {

// The tile kernel's shared memory: two stages, 128 query rows, the tile list.
template <KvKind kKind>
using TileLayout = SmemLayout<kKind, 2, kTileRows, TileMeta::kBytes>;

// The tile's query rows into the swizzled [128][128] query tile; unused rows are zero.
template <bool kF16>
__device__ __forceinline__ void stage_tile_query(const AttendParams& p, const TileWork& t,
                                                 unsigned char* q_tile, int tid) {
#pragma unroll 2
  for (int it = 0; it < kTileRows * 16 / kTileThreads; ++it) {
    const int idx = tid + it * kTileThreads;
    const int row = idx >> 4, c = idx & 15;
    *reinterpret_cast<uint4*>(q_tile + tile_offset(row, c)) = tile_query_chunk<kF16>(p, t, row, c);
  }
}

// Writes one row of a warp (rows r0 and r0 + 8 of the thread: half i) from the
// registers: output normalised by the row's sum, lse; 0 and -inf when empty.
__device__ __forceinline__ void write_tile_row(const AttendParams& p, const TileWork& t, WarpState& st,
                                               int i, int row, int lane) {
  float l = st.l[i];
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  const int tok = row / p.group, g = row - tok * p.group;
  if (tok >= t.count) return;
  const std::int64_t at = std::int64_t(t.first + tok) * p.num_q_heads + std::int64_t(t.head) * p.group + g;
  const float inv = l > 0.0f ? p.out_scale / l : 0.0f;
  auto* out = static_cast<std::uint16_t*>(p.out) + at * kDim + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const float a = st.o[n][2 * i] * inv, b = st.o[n][2 * i + 1] * inv;
    *reinterpret_cast<std::uint32_t*>(out + 8 * n) = p.out_fp16 ? pack2<true>(a, b) : pack2<false>(a, b);
  }
  if (p.lse != nullptr && (lane & 3) == 0)
    p.lse[at] = l > 0.0f ? (st.m[i] + log2f(l)) * kLn2 : -INFINITY;
}

template <KvKind kKind, bool kF16>
__global__ void __launch_bounds__(kTileThreads, 1) attend_tile_kernel(const __grid_constant__ AttendParams p) {
  using L = TileLayout<kKind>;
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const TileWork t = tile_of_cta(p, blockIdx.x, lane);
  if (t.request < 0) return;  // a tile number no request uses (uniform over the CTA)

  unsigned char* extra = smem + L::kExtra;
  const TileEntries entries = tile_entries(extra);
  if (tid < t.count) entries.pos[tid] = token_position(t.first + tid, t.seq, t.q0, t.q1);

  const Stager<kKind, kF16, L, kTileThreads> stager{smem, p, t.head, tid};
  stager.build_lut();
  stage_tile_query<kF16>(p, t, smem + L::kQ, tid);
  __syncthreads();
  const int n = build_union(p, t, extra, tid);

  // The thread's two rows, their tokens' positions and bits; the warp's tokens.
  const int row0 = warp * 16 + (lane >> 2);
  int pos[2];
  std::uint64_t bit[2];
  int max_pos = -1;
  for (int tok = 0; tok < t.count; ++tok) max_pos = max(max_pos, entries.pos[tok]);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int tok = (row0 + 8 * i) / p.group;
    pos[i] = tok < t.count ? entries.pos[tok] : -1;
    bit[i] = pos[i] >= 0 ? std::uint64_t(1) << tok : 0;
  }
  const std::uint64_t mine = bit[0] | bit[1];
  const std::uint64_t warp_tokens =
      std::uint64_t(__reduce_or_sync(0xffffffffu, unsigned(mine))) |
      std::uint64_t(__reduce_or_sync(0xffffffffu, unsigned(mine >> 32))) << 32;

  std::uint32_t qf[8][4];
  load_query_fragments(qf, smem_u32(smem + L::kQ) + warp * 16 * kRowBytes, lane);
  WarpState st;
  st.init();

  // Keys of entry i to load: those <= the tile's last position.
  auto load_keys = [&](int i) {
    const int v = max_pos - entries.block[i] * kBlockKeys + 1;
    return v < kBlockKeys ? v : kBlockKeys;
  };
  const float* k_scales = stager.k_token_scales();
  const float* v_scales = stager.v_token_scales();
  auto compute = [&](int i, int stage) {
    const std::uint64_t mask = entries.mask[i];
    if ((mask & warp_tokens) == 0) return;  // none of the warp's tokens selected the block
    const int base = entries.block[i] * kBlockKeys;
    const int limit[2] = {(mask & bit[0]) != 0 ? pos[0] - base + 1 : 0,
                          (mask & bit[1]) != 0 ? pos[1] - base + 1 : 0};
    attend_keys<kF16, 16>(st, qf, stager.k_tile(stage), stager.v_tile(stage), 0, lane, p.score_scale_log2, limit,
                          k_scales, v_scales);
  };

#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < n) stager.issue(s, entries.page[s], load_keys(s));
    cp_async_commit();
  }
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const int stage = i % kStages;
    if constexpr (L::kConverted) {
      stager.widen(stage, load_keys(i));
      __syncthreads();
      if (i + kStages < n) stager.issue(stage, entries.page[i + kStages], load_keys(i + kStages));
      cp_async_commit();
    }
    compute(i, stage);
    __syncthreads();
    if constexpr (!L::kConverted) {
      if (i + kStages < n) stager.issue(stage, entries.page[i + kStages], load_keys(i + kStages));
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
  write_tile_row(p, t, st, 0, row0, lane);
  write_tile_row(p, t, st, 1, row0 + 8, lane);
}

// Raises the kernel's dynamic shared-memory limit, once per device.
template <KvKind kKind, bool kF16>
void prepare_attend_tiles() {
  static std::atomic<std::uint64_t> done{0};
  once_per_device(done, [](int) {
    MSA_CUDA_CHECK(cudaFuncSetAttribute(attend_tile_kernel<kKind, kF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        TileLayout<kKind>::kBytes));
  });
}

// Launches the token-tile kernel over `ctas` CTAs (heuristics.hpp, tile_ctas).
template <KvKind kKind, bool kF16>
void launch_attend_tiles(const AttendParams& p, std::int64_t ctas, cudaStream_t stream) {
  prepare_attend_tiles<kKind, kF16>();
  attend_tile_kernel<kKind, kF16>
      <<<dim3(static_cast<unsigned>(ctas)), dim3(kTileThreads), TileLayout<kKind>::kBytes, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
