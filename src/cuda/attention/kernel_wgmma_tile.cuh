// The wgmma token-tile attention kernel (prefill rows, bf16 / fp16 / fp8 KV
// caches, sm_90a): the token tiles of kernel_tile.cuh (T consecutive prefill
// tokens of one request and one KV head, T x G = 128 query rows token-major,
// the sorted union of their selected blocks with the mask of the tokens that
// chose each) on Hopper's asynchronous units.
//
//  - The CTA is persistent for bf16 / fp16 caches (one per SM, tiles
//    blockIdx.x, blockIdx.x + gridDim.x, ...) and takes one tile for fp8.
//  - The whole CTA plans its first tile (plan_tile: the tile lookup, the union
//    list, the query rows); then three warps of the producer warpgroup plan
//    tile j + 1 while tile j runs, into the other of two plan buffers, so that
//    the consumers do not wait for a tile's global-memory round trips.
//  - The producer's first warp streams the union's blocks into two-slot
//    rings, one for K tiles and one for V tiles (128 keys x 128 dims, each as
//    two 128-byte-swizzled TMA boxes of 64 dims, kv_maps.hpp). Every slot has
//    a "full" mbarrier (the TMA's transaction count) and an "empty" one (one
//    arrival per consumer warp once its wgmma reads of the slot are done).
//    Slots and phases run on over the CTA's tiles. fp8: the whole producer
//    warpgroup widens each raw tile in place (widen_fp8_blocks).
//  - Two consumer warpgroups own 64 rows each. Iteration i issues S(i) =
//    Q K(i)^T (Q and K from shared memory) and O += P(i-1) V(i-1) (P from
//    registers, V an MN-major operand), then masks S(i) to each row's own
//    selection and causal limit and runs the online softmax (log2 units):
//    for bf16 / fp16 the scores' part as soon as S(i) is done, while the
//    warpgroup's own PV(i-1) is still in flight (two wgmma groups), and in
//    any case while the other warpgroup's wgmma run: two named barriers pass
//    the turn to issue between the warpgroups ("ping-pong"). A warpgroup none
//    of whose tokens selected a block issues nothing for it.
//  - Keys past the tile's last position in its last block may be unwritten
//    (any bytes, NaN included): their scores are masked, and the producer
//    zeroes that block's V rows past the last position before the consumers
//    see the tile, so that 0 x NaN never reaches O.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/attention/kernel.cuh"
#include "cuda/attention/kernel_tile_entries.cuh"
#include "cuda/attention/kernel_wgmma_layout.cuh"
#include "cuda/attention/kernel_wgmma_plan.cuh"
#include "cuda/attention/kernel_wgmma_producer.cuh"
#include "cuda/attention/kernel_wgmma_softmax.cuh"
#include "cuda/attention/kv_maps.hpp"
#include "cuda/attention/wgmma.cuh"

namespace msa::cuda::attention {

template <KvKind kKind, bool kF16>
__global__ void __launch_bounds__(WgmmaTile::kThreads, 1)
    attend_wgmma_tile_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ KvMaps maps) {
  using W = WgmmaTile;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const WgmmaBars bar{smem_u32(smem + W::kBars)};
  // The CTA's tiles: numbers blockIdx.x + j * gridDim.x below p.tile_count.
  const std::int64_t first_tile = blockIdx.x, stride = gridDim.x;
  auto tile_number = [&](int j) { return first_tile + std::int64_t(j) * stride; };
  auto has_tile = [&](int j) { return tile_number(j) < p.tile_count; };
  auto plan_at = [&](int j) { return smem + W::kPlans + plan_buffer(j) * W::kPlanBytes; };

  if (tid == W::kProducerWarp * 32) {
    for (int s = 0; s < W::kSlots; ++s) {
      sm90::mbar_init(bar.full_k(s), 1);
      sm90::mbar_init(bar.full_v(s), 1);
      sm90::mbar_init(bar.empty_k(s), W::kConsumers * 4);
      sm90::mbar_init(bar.empty_v(s), W::kConsumers * 4);
      sm90::mbar_init(bar.raw_k(s), 1);
      sm90::mbar_init(bar.raw_v(s), 1);
    }
    sm90::mbar_init(bar.tail(), 1);
    sm90::mbar_init_fence();
  }
  // Tile 0: the whole CTA plans it (there is nothing to overlap yet).
  plan_tile<kF16, W::kThreads>(p, tile_number(0), smem, plan_buffer(0), tid, lane, [] { __syncthreads(); });

  if (warp >= W::kProducerWarp) {
    sm90::regs_dec<W::producer_regs(kKind)>();
    const int ptid = tid - W::kProducerWarp * 32;
    int g0 = 0, tails = 0;
    for (int j = 0; has_tile(j); ++j) {
      const int b = plan_buffer(j);
      // Planners: tile j (j > 0) once the consumers are done with tile j - 2's buffer.
      if (warp > W::kProducerWarp) {
        if (j > 0) {
          if (j >= 2) sm90::named_barrier_sync(W::kPlanFree + b, W::kPlanFreeThreads);
          plan_tile<kF16, W::kPlanners>(p, tile_number(j), smem, b, ptid - 32, lane,
                                        [] { sm90::named_barrier_sync(W::kPlanBar, W::kPlanners); });
          sm90::named_barrier_arrive(W::kPlanFull + b, W::kPlanFullThreads);
        }
        if constexpr (kKind == KvKind::half) continue;
      } else if (j > 0) {
        sm90::named_barrier_sync(W::kPlanFull + b, W::kPlanFullThreads);
      }
      // Streamers (bf16 / fp16: the first warp; fp8: the warpgroup): tile j once planned.
      const unsigned char* plan = plan_at(j);
      const auto* header = reinterpret_cast<const std::int32_t*>(plan);
      const TileEntries entries = list_entries(const_cast<unsigned char*>(plan) + W::kHeaderBytes);
      const int n = header[PlanHeader::kEntries], head = header[PlanHeader::kHead];
      const int tail_block = header[PlanHeader::kTailBlock], tail_keys = header[PlanHeader::kTailKeys];
      if constexpr (kKind == KvKind::half)
        load_half_blocks(maps, entries, n, head, tail_block, tail_keys, smem, bar, lane, g0, tails);
      else
        widen_fp8_blocks<kKind, kF16>(maps, entries, n, head, tail_block, tail_keys, smem, bar, ptid, g0);
      g0 += n;
    }
    return;
  }

  // ---- consumers: warpgroup wg owns rows 64 wg .. 64 wg + 63 of each tile ----
  sm90::regs_inc<W::consumer_regs(kKind)>();
  const int wg = warp >> 2;
  const int row0 = 64 * wg + 16 * (warp & 3) + (lane >> 2);  // the thread's rows: row0, row0 + 8
  const float scale = p.score_scale_log2;
  const int col = 2 * (lane & 3);
  // bf16 / fp16: the scores' softmax of block i overlaps the warpgroup's own
  // PV(i - 1) (measured +5-6% on 16K-32K-token chunks); fp8, whose producer
  // warpgroup widens every tile and competes for issue slots, measured 10%
  // slower that way and keeps one group per round.
  constexpr bool kOverlapSoftmax = kKind == KvKind::half;
  const std::uint32_t k_base = smem_u32(smem + W::kK), v_base = smem_u32(smem + W::kV);
  // The turn to issue starts with warpgroup 0; each warpgroup passes it on
  // after issuing, and warpgroup 1 does not pass it after the CTA's last round.
  constexpr int kPeers = W::kConsumers * 128;
  if (wg == 1) sm90::named_barrier_arrive(W::kTurn, kPeers);
  int g0 = 0;
  for (int j = 0; has_tile(j); ++j) {
    const bool last_tile = !has_tile(j + 1);
    if (j > 0) sm90::named_barrier_sync(W::kPlanFull + plan_buffer(j), W::kPlanFullThreads);
    unsigned char* plan = plan_at(j);
    const auto* header = reinterpret_cast<const std::int32_t*>(plan);
    const TileEntries entries = list_entries(plan + W::kHeaderBytes);
    const int n = header[PlanHeader::kEntries], first = header[PlanHeader::kFirst];
    const int count = header[PlanHeader::kCount], head = header[PlanHeader::kHead];
    int pos[2];
    std::uint64_t bit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tok = (row0 + 8 * i) / p.group;
      pos[i] = tok < count ? entries.pos[tok] : -1;
      bit[i] = pos[i] >= 0 ? std::uint64_t(1) << tok : 0;
    }
    std::uint64_t wg_tokens = 0;  // tokens with rows in this warpgroup
    for (int tok = (64 * wg) / p.group; tok <= (64 * wg + 63) / p.group && tok < count; ++tok)
      wg_tokens |= std::uint64_t(1) << tok;

    const std::uint32_t q_base = smem_u32(smem + W::kQ + plan_buffer(j) * W::kQBuf + wg * W::kQBytes);
    float o[64], sc[64];
#pragma unroll
    for (int e = 0; e < 64; ++e) o[e] = sc[e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    std::uint32_t pa[8][4];
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0;

    bool prev_active = false;  // this warpgroup attended block i - 1 (P(i - 1) in pa)
    for (int i = 0; i <= n; ++i) {
      const bool active = i < n && (entries.mask[i] & wg_tokens) != 0;
      const int s = ring_slot(g0 + i), sp = ring_slot(g0 + i + W::kSlots - 1);
      if (i < n) sm90::mbar_wait(bar.full_k(s), ring_parity(g0 + i));
      if (prev_active) sm90::mbar_wait(bar.full_v(sp), ring_parity(g0 + i - 1));
      sm90::named_barrier_sync(W::kTurn + wg, kPeers);
      // Each combination issues straight-line wgmma (no branch inside a group).
      auto issue_pv = [&] {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const std::uint64_t b = sm90::sw128_desc(v_base + sp * W::kPlaneBytes + kk * 2048, W::kAtomBytes, 1024);
          sm90::wgmma_rs<kF16>(o, pa[kk], b, 1);
        }
      };
      auto issue_qk = [&] {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
          const std::uint64_t a = sm90::sw128_desc(q_base + (kk >> 2) * W::kQAtomBytes + (kk & 3) * 32, 16, 1024);
          const std::uint64_t b =
              sm90::sw128_desc(k_base + s * W::kPlaneBytes + (kk >> 2) * W::kAtomBytes + (kk & 3) * 32, 16, 1024);
          sm90::wgmma_ss<kF16>(sc, a, b, kk > 0 ? 1 : 0);
        }
      };
      auto pass_turn = [&] {
        if (!(wg == 1 && i == n && last_tile)) sm90::named_barrier_arrive(W::kTurn + (1 - wg), kPeers);
      };
      // Softmax of block i: the scores' part runs while this warpgroup's PV(i - 1) is in flight.
      auto scores = [&] {
        const int base = entries.block[i] * kBlockKeys;
        const std::uint64_t mask = entries.mask[i];
        const int limit0 = (mask & bit[0]) != 0 ? pos[0] - base + 1 : 0;
        const int limit1 = (mask & bit[1]) != 0 ? pos[1] - base + 1 : 0;
        return softmax_scores_any(sc, m, l, limit0, limit1, scale, col);
      };
      if (prev_active && active && kOverlapSoftmax) {  // QK(i), then PV(i - 1): two groups, done in order
        sm90::fence_registers(o);
        sm90::fence_registers(sc);
        sm90::wgmma_fence();
        issue_qk();
        sm90::wgmma_commit();
        issue_pv();
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<1>();
        sm90::fence_registers(sc);
        const Rescale r = scores();
        sm90::wgmma_wait<0>();
        sm90::fence_registers(o);
        sm90::fence_registers(pa);
        softmax_output<kF16>(sc, o, pa, r);
      } else if (prev_active && active) {  // PV(i - 1) and QK(i) as one group
        sm90::fence_registers(o);
        sm90::fence_registers(sc);
        sm90::wgmma_fence();
        issue_pv();
        issue_qk();
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<0>();
        sm90::fence_registers(o);
        sm90::fence_registers(sc);
        sm90::fence_registers(pa);
        const Rescale r = scores();
        softmax_output<kF16>(sc, o, pa, r);
      } else if (prev_active) {
        sm90::fence_registers(o);
        sm90::wgmma_fence();
        issue_pv();
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<0>();
        sm90::fence_registers(o);
        sm90::fence_registers(pa);
      } else if (active) {
        sm90::fence_registers(sc);
        sm90::wgmma_fence();
        issue_qk();
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<0>();
        sm90::fence_registers(sc);
        const Rescale r = scores();
        softmax_output<kF16>(sc, o, pa, r);
      } else {
        pass_turn();
      }
      __syncwarp();
      if (lane == 0) {
        if (i > 0) sm90::mbar_arrive(bar.empty_v(sp));
        if (i < n) sm90::mbar_arrive(bar.empty_k(s));
      }
      prev_active = active;
    }
    // The plan buffer (its list and Q rows) is free once every warp is past
    // its last wgmma; the planners take it for tile j + 2.
    sm90::fence_proxy_async();
    if (has_tile(j + 2)) sm90::named_barrier_arrive(W::kPlanFree + plan_buffer(j), W::kPlanFreeThreads);
    g0 += n;

    // Epilogue: rows normalised by their sums; 0 and -inf for rows that attended nothing.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = l[i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = row0 + 8 * i;
      const int tok = row / p.group, g = row - tok * p.group;
      if (tok >= count) continue;
      const std::int64_t at = std::int64_t(first + tok) * p.num_q_heads + std::int64_t(head) * p.group + g;
      const float inv = sum > 0.0f ? p.out_scale / sum : 0.0f;
      auto* out = static_cast<std::uint16_t*>(p.out) + at * kDim + col;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        const float x = o[4 * e + 2 * i] * inv, y = o[4 * e + 2 * i + 1] * inv;
        *reinterpret_cast<std::uint32_t*>(out + 8 * e) = p.out_fp16 ? pack2<true>(x, y) : pack2<false>(x, y);
      }
      if (p.lse != nullptr && (lane & 3) == 0) p.lse[at] = sum > 0.0f ? (m[i] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
}

// Raises the kernel's dynamic shared-memory limit, once per device.
template <KvKind kKind, bool kF16>
void prepare_attend_wgmma_tiles() {
  static std::atomic<std::uint64_t> done{0};  // bit d: device d prepared
  int device = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  const std::uint64_t bit = device < 64 ? std::uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return;
  MSA_CUDA_CHECK(cudaFuncSetAttribute(attend_wgmma_tile_kernel<kKind, kF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      WgmmaTile::kBytes));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// Launches the wgmma token-tile kernel over p.tile_count tile numbers
// (heuristics.hpp, tile_ctas; p.tile_tokens x p.group = 128): one CTA per SM
// looping over them for bf16 / fp16 caches, one CTA per tile for fp8.
template <KvKind kKind, bool kF16>
void launch_attend_wgmma_tiles(const AttendParams& p, const KvMaps& maps, cudaStream_t stream) {
  prepare_attend_wgmma_tiles<kKind, kF16>();
  std::int64_t ctas = p.tile_count;
  if constexpr (kKind == KvKind::half) {
    int device = 0, sms = 0;
    MSA_CUDA_CHECK(cudaGetDevice(&device));
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    ctas = std::min<std::int64_t>(ctas, std::max(sms, 1));
  }
  if (ctas <= 0) return;
  attend_wgmma_tile_kernel<kKind, kF16>
      <<<dim3(static_cast<unsigned>(ctas)), dim3(WgmmaTile::kThreads), WgmmaTile::kBytes, stream>>>(p, maps);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
