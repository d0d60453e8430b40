// The wgmma token-tile attention kernel (prefill rows, bf16 / fp16 / fp8 / nvfp4 KV
// caches, sm_90a): the token tiles of prefill_mma_sync/kernel.cuh (T consecutive prefill
// tokens of one request and one KV head, T x G = 128 query rows token-major,
// the sorted union of their selected blocks with the mask of the tokens that
// chose each) on Hopper's asynchronous units.
//
//  - The CTA is persistent for bf16 / fp16 caches (one per SM, tiles
//    blockIdx.x, blockIdx.x + gridDim.x, ...) and takes one tile for fp8 / nvfp4.
//  - The whole CTA plans its first tile (plan_tile: the tile lookup, the union
//    list, the query rows, by TMA as soon as the tile is known; bf16 / fp16: the
//    K tile of the block of the tile's last position, the "lead block", goes
//    out before the union is built, and that block is the union's entry 0);
//    then three warps of the producer warpgroup plan
//    tile j + 1 while tile j runs, into the other of two plan buffers, so that
//    the consumers do not wait for a tile's global-memory round trips.
//  - The producer's first warp streams the union's blocks into two-slot
//    rings, one for K tiles and one for V tiles (128 keys x 128 dims, each as
//    two 128-byte-swizzled TMA boxes of 64 dims, kv_maps.hpp). Every slot has
//    a "full" mbarrier (the TMA's transaction count) and an "empty" one (one
//    arrival per consumer warp once its wgmma reads of the slot are done; per
//    thread with fp8 per-token scales, WgmmaTile::full_arrivals).
//    Slots and phases run on over the CTA's tiles. fp8 / nvfp4: the whole
//    producer warpgroup widens each raw tile in place (widen_fp8_blocks,
//    widen_fp4_blocks; nvfp4 loads its head-slot runs by bulk copy).
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
#include <limits>
#include <type_traits>

#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/common/check.cuh"
#include "cuda/attention/format.cuh"
#include "cuda/attention/shared/tile_scheduler.cuh"
#include "cuda/attention/prefill/mainloop.cuh"
#include "cuda/attention/prefill/layout.cuh"
#include "cuda/attention/prefill/scheduler.cuh"
#include "cuda/attention/prefill/load.cuh"
#include "cuda/attention/prefill/produce_fp4.cuh"
#include "cuda/attention/prefill/produce_fp8.cuh"
#include "cuda/attention/prefill/softmax.cuh"
#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/host/launch_wgmma.hpp"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/device.hpp"

namespace msa::cuda::attention {

// kScaled: bf16 / fp16 pages of fp8
// codes widened ahead with their per-token scales (p.cache.k_scales: float
// [pages][heads][2][128], widen/choice.hpp), applied to the fp32 scores and
// probabilities.
template <KvKind kKind, bool kF16, bool kScaled = false>
__global__ void __launch_bounds__(WgmmaTile::kThreads, 1)
    attend_wgmma_tile_kernel(const __grid_constant__ AttendParams p, const __grid_constant__ KvMaps maps) {
  // Formats read as stored run persistent CTAs over many tiles; converted ones a CTA per tile.
  constexpr bool kAsStored = !kv_format(kKind).converted;
  static_assert(!kScaled || kAsStored, "scaled pages run on persistent (bf16 / fp16) CTAs");
  using W = WgmmaTile;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const WgmmaBars bar{smem_u32(smem + W::kBars)};
  // The CTA's tiles: numbers blockIdx.x + j * gridDim.x below the tile count
  // (gated by the device's choice in a step that may run key-major).
  const std::int64_t tile_count = p.tile_gate != nullptr ? min(p.tile_count, *p.tile_gate) : p.tile_count;
  const std::int64_t first_tile = blockIdx.x, stride = gridDim.x;
  // How many of them (the launch keeps tile numbers below 2^31).
  const unsigned left = unsigned(min(tile_count - first_tile, std::int64_t(0x7fffffff)));
  const int tiles = tile_count > first_tile ? int((left + unsigned(stride) - 1u) / unsigned(stride)) : 0;
  auto tile_number = [&](int j) { return first_tile + std::int64_t(j) * stride; };
  auto has_tile = [&](int j) { return j < tiles; };
  if (!has_tile(0)) return;
  auto plan = [&](int j, int b, int w, int lane, auto sync, auto workers, auto after_union, auto lead_load) {
    constexpr int kWorkers = decltype(workers)::value;
    plan_tile<kF16, kWorkers>(p, tile_number(j), smem, b, w, lane, sync, after_union, lead_load,
                              [&](unsigned char* q, int first, int head) {
                                load_q_rows(maps.q, q, bar.q_rows(), first, head, p.group);
                              });
  };
  auto no_lead = [](int, int) { return false; };
  auto plan_at = [&](int j) { return smem + W::kPlans + plan_buffer(j) * W::kPlanBytes; };

  if (tid == W::kProducerWarp * 32) {
    const bool every_thread = !kAsStored && every_thread_arrives(p);  // (one-tile CTAs only)
    // Scaled pages: every consumer thread reads the slot's scales and releases it itself.
    const bool every_consumer = every_thread || kScaled;
    for (int s = 0; s < W::kSlots; ++s) {
      sm90::mbar_init(bar.full_k(s), W::full_arrivals(every_thread));
      sm90::mbar_init(bar.full_v(s), W::full_arrivals(every_thread));
      sm90::mbar_init(bar.empty_k(s), W::empty_arrivals(every_consumer));
      sm90::mbar_init(bar.empty_v(s), W::empty_arrivals(every_consumer));
      sm90::mbar_init(bar.raw_k(s), 1);
      sm90::mbar_init(bar.raw_v(s), 1);
    }
    sm90::mbar_init(bar.tail(), 1);
    sm90::mbar_init(bar.q_rows(), 1);
    sm90::mbar_init_fence();
  }
  // Tile 0: the whole CTA plans it (there is nothing to overlap yet). Its
  // query rows come by TMA when the query is the MMA type (maps.q), issued by
  // kLeadWorker (the thread that initialised the barriers) once the tile is
  // known. With bf16 / fp16 caches that thread (the streaming warp's lane 0)
  // also starts the lead block's K load before the union is built, and the K
  // load of the union's next block (entry 1 after a lead block, else entry 0)
  // once the union is listed.
  int k_issued = 0;  // (the streaming warp)
  plan(0, plan_buffer(0), tid, lane, [] { __syncthreads(); }, std::integral_constant<int, W::kThreads>{},
       [&](int n, int head, unsigned char* list) {
         if constexpr (kAsStored) {
           if (warp != W::kProducerWarp) return;
           k_issued = lead_block(list) >= 0 ? 1 : 0;
           if (k_issued >= n) return;
           if (lane == 0)
             load_k_tile<kScaled>(maps, list_entries(list).page[k_issued], head, smem, bar, k_issued, p.cache.k_scales,
                                  p.num_kv_heads);
           ++k_issued;
         }
       },
       [&](int page, int head) {
         if constexpr (kAsStored) {
           load_k_tile<kScaled>(maps, page, head, smem, bar, 0, p.cache.k_scales,
                                p.num_kv_heads);  // (kLeadWorker: this warp's lane 0)
           return true;
         } else {
           return false;
         }
       });

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
          plan(j, b, ptid - 32, lane, [] { sm90::named_barrier_sync(W::kPlanBar, W::kPlanners); },
               std::integral_constant<int, W::kPlanners>{}, [](int, int, unsigned char*) {}, no_lead);
          sm90::named_barrier_arrive(W::kPlanFull + b, W::kPlanFullThreads);
        }
        if constexpr (kAsStored) continue;
      } else if (j > 0) {
        sm90::named_barrier_sync(W::kPlanFull + b, W::kPlanFullThreads);
      }
      // Streamers (bf16 / fp16: the first warp; fp8: the warpgroup): tile j once planned.
      const unsigned char* plan = plan_at(j);
      const auto* header = reinterpret_cast<const std::int32_t*>(plan);
      const TileEntries entries = list_entries(const_cast<unsigned char*>(plan) + W::kHeaderBytes);
      const int n = header[PlanHeader::kEntries], head = header[PlanHeader::kHead];
      const int tail_block = header[PlanHeader::kTailBlock], tail_keys = header[PlanHeader::kTailKeys];
      Format<kKind>::TileProducer::template stream<kKind, kF16, kScaled>(
          p, maps, entries, n, head, tail_block, tail_keys, smem, bar, lane, ptid, g0, tails, j == 0 ? k_issued : 0);
      g0 += n;
    }
    return;
  }

  // ---- consumers (prefill/mainloop.cuh) ----
  sm90::regs_inc<W::consumer_regs(kKind)>();
  // Warp-uniform to the compiler: what derives from it (the Q tile's
  // descriptors, the barrier ids) then lives in uniform registers (measured
  // 3% faster on 16K-token chunks than the per-thread value).
  const int wg = sm90::warp_uniform(warp >> 2);
  const Consumer c{smem, bar, tiles, wg, lane, 64 * wg + 16 * (warp & 3) + (lane >> 2), 2 * (lane & 3),
                   smem_u32(smem + W::kK), smem_u32(smem + W::kV)};
  // The turn to issue starts with warpgroup 0.
  if (wg == 1) sm90::named_barrier_arrive(W::kTurn, kTurnPeers);
  if constexpr (kAsStored)
    consume_tiles<kF16, kScaled>(p, maps, c);
  else
    consume_one_tile<kF16>(p, maps, c);
}

template <KvKind kKind, bool kF16, bool kScaled>
void prepare_attend_wgmma_tiles() {
  static std::atomic<std::uint64_t> done{0};
  raise_smem_limit_once(done, attend_wgmma_tile_kernel<kKind, kF16, kScaled>, WgmmaTile::kBytes);
}

// Launches the wgmma token-tile kernel over p.tile_count tile numbers
// (heuristics.hpp, tile_ctas; p.tile_tokens x p.group = 128): one CTA per SM
// looping over them for bf16 / fp16 caches, one CTA per tile for fp8 / nvfp4
// (whose maps are unused: the producer bulk-copies the head-slot runs).
template <KvKind kKind, bool kF16, bool kScaled>
void launch_attend_wgmma_tiles(const AttendParams& p, const KvMaps& maps, cudaStream_t stream) {
  prepare_attend_wgmma_tiles<kKind, kF16, kScaled>();
  MSA_CHECK(p.tile_count <= std::numeric_limits<std::int32_t>::max(), "attend: ", p.tile_count,
            " token tiles exceed the kernel's limit of 2^31 - 1");
  std::int64_t ctas = p.tile_count;
  if constexpr (!kv_format(kKind).converted) {
    ctas = std::min<std::int64_t>(ctas, std::max(device_sm_count(), 1));
  }
  if (ctas <= 0) return;
  attend_wgmma_tile_kernel<kKind, kF16, kScaled>
      <<<dim3(static_cast<unsigned>(ctas)), dim3(WgmmaTile::kThreads), WgmmaTile::kBytes, stream>>>(p, maps);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::attention
