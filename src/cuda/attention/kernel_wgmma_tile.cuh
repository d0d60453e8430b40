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

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/attention/kernel.cuh"
#include "cuda/attention/kernel_tile_entries.cuh"
#include "cuda/attention/kernel_tile_query.cuh"
#include "cuda/attention/kv_maps.hpp"
#include "cuda/attention/wgmma.cuh"

namespace msa::cuda::attention {

// Shape and shared-memory layout (byte offsets from the 1 KiB-aligned base).
struct WgmmaTile {
  static constexpr int kConsumers = 2;                     // warpgroups of 64 rows
  static constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
  static constexpr int kProducerWarp = kConsumers * 4;     // streams K / V (bf16 / fp16)
  static constexpr int kPlanners = 96;                     // the producer's other three warps
  // Registers per thread after the split (setmaxnreg), 128 x producer + 256 x
  // consumer <= 64K: the producer plans tiles, and for fp8 widens rows too
  // (the least counts with which ptxas spills nothing on either side).
  static constexpr int producer_regs(KvKind kind) { return kind == KvKind::half ? 64 : 80; }
  static constexpr int consumer_regs(KvKind kind) { return kind == KvKind::half ? 216 : 208; }
  static constexpr int kSlots = 2;                         // per ring (K, V)
  static constexpr int kAtomBytes = kBlockKeys * 128;      // 16 KiB: 64 dims of 128 keys
  static constexpr int kPlaneBytes = 2 * kAtomBytes;       // 32 KiB: one K or V tile
  static constexpr int kQBytes = 64 * kDim * 2;            // 16 KiB: a warpgroup's 64 rows
  static constexpr int kQAtomBytes = 64 * 128;             // 8 KiB: 64 dims of 64 rows
  static constexpr int kQBuf = kConsumers * kQBytes;       // a tile's rows
  static constexpr int kQ = 0;                             // [2][kConsumers][2][64][64] MMA type
  static constexpr int kK = kQ + 2 * kQBuf;                // [kSlots][2][128][64]
  static constexpr int kV = kK + kSlots * kPlaneBytes;     // [kSlots][2][128][64]
  // uint64 mbarriers: full K [2], full V [2], empty K [2], empty V [2], tail,
  // raw K [2], raw V [2] (fp8)
  static constexpr int kBars = kV + kSlots * kPlaneBytes;
  // Plan buffers [2]: the tile's header (int32 [8], PlanHeader) then its TileList.
  static constexpr int kPlans = kBars + 256;
  static constexpr int kHeaderBytes = 32;
  static constexpr int kPlanBytes = (kHeaderBytes + TileList::kBytes + 127) / 128 * 128;
  static constexpr int kBytes = kPlans + 2 * kPlanBytes + 1024;  // + alignment slack
  // Named barriers: 0 is __syncthreads; warpgroup w waits on kTurn + w for its
  // turn to issue; the producer warpgroup (fp8 widening) syncs on kWidenBar,
  // the planners on kPlanBar. Plan buffer b is handed over on kPlanFull + b
  // (the planners arrive, the consumers and the first producer warp wait) and
  // handed back on kPlanFree + b (the consumers arrive, the planners wait).
  static constexpr int kTurn = 1;
  static constexpr int kWidenBar = 3;
  static constexpr int kPlanBar = 4;
  static constexpr int kPlanFull = 5;
  static constexpr int kPlanFree = 7;
  static constexpr int kPlanFullThreads = kThreads;                    // 96 + 256 + 32
  static constexpr int kPlanFreeThreads = kConsumers * 128 + kPlanners;  // 256 + 96
  static_assert(kBytes <= 227 * 1024, "shared memory beyond the sm_90 limit");
  static_assert(kK % 1024 == 0 && kPlaneBytes % 1024 == 0, "swizzled tiles need 1 KiB alignment");
  static_assert(UnionScratch::kBytes <= kQBuf, "the union scratch lives in the next tile's Q buffer");
};

// What the planners tell the other roles about a tile (int32 [8] at the plan buffer's start).
struct PlanHeader {
  static constexpr int kRequest = 0;    // -1: the tile number has no tile
  static constexpr int kFirst = 1;      // first token
  static constexpr int kCount = 2;      // tokens
  static constexpr int kHead = 3;       // KV head
  static constexpr int kEntries = 4;    // union entries
  static constexpr int kTailBlock = 5;  // block of the tile's last position, or -1
  static constexpr int kTailKeys = 6;   // keys of that block any row sees
};

// Map coordinate of dimension `dim` (1..3) for (head, page); the token axis starts at 0.
__device__ __forceinline__ int map_coord(const KvMaps& m, int dim, int head, int page) {
  return dim == m.head_dim ? head : dim == m.page_dim ? page : 0;
}

// The tile's query rows (converted to the MMA type) into the two warpgroups'
// swizzled Q tiles; rows of tokens past the tile are zero. kWorkers threads
// (w in [0, kWorkers)) share the chunks.
template <bool kF16, int kWorkers>
__device__ __forceinline__ void stage_wgmma_query(const AttendParams& p, const TileWork& t, unsigned char* q,
                                                  int w) {
  constexpr int kChunks = kTileRows * 16;  // 16-byte chunks of 8 elements
#pragma unroll 2
  for (int idx = w; idx < kChunks; idx += kWorkers) {
    const int row = idx >> 4, c = idx & 15;
    const uint4 v = tile_query_chunk<kF16>(p, t, row, c);
    const int wg = row >> 6, r = row & 63;
    const int at = wg * WgmmaTile::kQBytes + (c >> 3) * WgmmaTile::kQAtomBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(q + at) = v;
  }
}

// Zeroes the rows >= `keys` of a V tile (both 64-dim halves; a whole row is
// zero whatever its swizzle), then the proxy fence (wgmma reads the tile).
__device__ __forceinline__ void zero_v_rows(unsigned char* tile, int keys, int lane) {
  const int chunks = (kBlockKeys - keys) * 16;
  for (int idx = lane; idx < chunks; idx += 32) {
    const int r = keys + (idx >> 4), c = idx & 15;
    *reinterpret_cast<uint4*>(tile + (c >> 3) * WgmmaTile::kAtomBytes + r * 128 + ((c & 7) << 4)) =
        make_uint4(0, 0, 0, 0);
  }
  sm90::fence_proxy_async();
}

// A row's running max moves only when a block's max exceeds it by more than
// this (log2 units), so that most blocks skip the rescale of O; P stays
// <= 2^8, exact in the MMA type's exponent range, and l and the lse use the
// same max, so the result does not change.
inline constexpr float kRescaleSlack = 8.0f;

// How a block's softmax rescales the rows' output (softmax_scores).
struct Rescale {
  float alpha0 = 1.0f, alpha1 = 1.0f;  // factors of the thread's two rows
  bool any = false;                    // some row of the warp raised its max
};

// Online softmax of one block for the thread's two rows, first part (it
// touches neither O nor P, so it runs while the warpgroup's PV of the
// previous block is in flight): masks the scores of keys >= limit[i] (key
// index inside the block; kMasked false: every key is visible to both rows),
// moves the running max m (kRescaleSlack) and sum l, and leaves the
// exponentials in sc. softmax_output then rescales O and packs P.
// The scale is folded into the exponent (one FFMA per score), which needs
// scale > 0 (a masked -inf score then gives exactly 0); softmax_scores_any
// picks the variant.
//   sc: the 64 x 128 score fragment (rows lane/4 and lane/4 + 8 of the warp)
template <bool kMasked>
__device__ __forceinline__ Rescale softmax_scores(float (&sc)[64], float (&m)[2], float (&l)[2], int limit0,
                                                  int limit1, float scale, int col) {
  // Four partial maxima / sums per row: short dependency chains.
  float px0[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, px1[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if constexpr (kMasked) {
        const int key = 8 * j + col + e;
        sc[4 * j + e] = key < limit0 ? sc[4 * j + e] : -INFINITY;
        sc[4 * j + 2 + e] = key < limit1 ? sc[4 * j + 2 + e] : -INFINITY;
      }
      const int a = (2 * j + e) & 3;
      px0[a] = fmaxf(px0[a], sc[4 * j + e]);
      px1[a] = fmaxf(px1[a], sc[4 * j + 2 + e]);
    }
  }
  float mx0 = fmaxf(fmaxf(px0[0], px0[1]), fmaxf(px0[2], px0[3]));
  float mx1 = fmaxf(fmaxf(px1[0], px1[1]), fmaxf(px1[2], px1[3]));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  // A row raises its max when the block's exceeds it by more than the slack
  // (from -inf: whenever the block has a visible key).
  const bool raise0 = mx0 * scale > m[0] + kRescaleSlack, raise1 = mx1 * scale > m[1] + kRescaleSlack;
  const float new0 = raise0 ? mx0 * scale : m[0], new1 = raise1 ? mx1 * scale : m[1];
  const float use0 = new0 == -INFINITY ? 0.0f : new0, use1 = new1 == -INFINITY ? 0.0f : new1;
  Rescale r;
  r.alpha0 = raise0 ? fast_exp2(m[0] - use0) : 1.0f;
  r.alpha1 = raise1 ? fast_exp2(m[1] - use1) : 1.0f;
  r.any = __any_sync(0xffffffffu, raise0 || raise1);
  m[0] = new0;
  m[1] = new1;
  float ps0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ps1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int a = (2 * j + e) & 3;
      sc[4 * j + e] = fast_exp2(fmaf(sc[4 * j + e], scale, -use0));
      sc[4 * j + 2 + e] = fast_exp2(fmaf(sc[4 * j + 2 + e], scale, -use1));
      ps0[a] += sc[4 * j + e];
      ps1[a] += sc[4 * j + 2 + e];
    }
  }
  l[0] = l[0] * r.alpha0 + ((ps0[0] + ps0[1]) + (ps0[2] + ps0[3]));
  l[1] = l[1] * r.alpha1 + ((ps1[0] + ps1[1]) + (ps1[2] + ps1[3]));
  return r;
}

// Second part, once the warpgroup's PV of the previous block is done: O
// rescaled, P (the MMA type) as the A fragments of the 8 k-steps of 16 keys.
template <bool kF16>
__device__ __forceinline__ void softmax_output(const float (&sc)[64], float (&o)[64], std::uint32_t (&pa)[8][4],
                                               const Rescale& r) {
  if (r.any) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= r.alpha0;
      o[4 * j + 1] *= r.alpha0;
      o[4 * j + 2] *= r.alpha1;
      o[4 * j + 3] *= r.alpha1;
    }
  }
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack2<kF16>(sc[8 * kk], sc[8 * kk + 1]);
    pa[kk][1] = pack2<kF16>(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = pack2<kF16>(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = pack2<kF16>(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}

// softmax_scores for any scale (zero or negative included, where folding the
// scale into the exponent would not mask): scores are scaled before the mask
// and the max; otherwise the variant that masks only when a limit cuts the block.
__device__ __forceinline__ Rescale softmax_scores_any(float (&sc)[64], float (&m)[2], float (&l)[2], int limit0,
                                                      int limit1, float scale, int col) {
  if (!(scale > 0.0f)) {
#pragma unroll
    for (int j = 0; j < 64; ++j) sc[j] *= scale;
    return softmax_scores<true>(sc, m, l, limit0, limit1, 1.0f, col);
  }
  if (limit0 >= kBlockKeys && limit1 >= kBlockKeys) return softmax_scores<false>(sc, m, l, limit0, limit1, scale, col);
  return softmax_scores<true>(sc, m, l, limit0, limit1, scale, col);
}

// The kernel's mbarriers (shared addresses), 8 bytes each from WgmmaTile::kBars.
struct WgmmaBars {
  std::uint32_t base;
  __device__ std::uint32_t full_k(int s) const { return base + 8u * std::uint32_t(s); }       // K slot ready
  __device__ std::uint32_t full_v(int s) const { return base + 8u * std::uint32_t(2 + s); }   // V slot ready
  __device__ std::uint32_t empty_k(int s) const { return base + 8u * std::uint32_t(4 + s); }  // K slot read
  __device__ std::uint32_t empty_v(int s) const { return base + 8u * std::uint32_t(6 + s); }  // V slot read
  __device__ std::uint32_t tail() const { return base + 64u; }  // bf16 / fp16: the tail V tile's own load
  __device__ std::uint32_t raw_k(int s) const { return base + 8u * std::uint32_t(9 + s); }    // fp8 K bytes landed
  __device__ std::uint32_t raw_v(int s) const { return base + 8u * std::uint32_t(11 + s); }   // fp8 V bytes landed
};

// Slot and phase parity of the CTA's g-th streamed block (counted over its tiles).
__device__ __forceinline__ int ring_slot(int g) { return g % WgmmaTile::kSlots; }
__device__ __forceinline__ std::uint32_t ring_parity(int g) { return std::uint32_t((g / WgmmaTile::kSlots) & 1); }

// bf16 / fp16 producer (one warp), one tile: K and V of every union block by
// TMA straight into the slots; g0 blocks went before it. Block g waits for
// block g - 2's slot. The tail block's V goes through its own barrier
// (`tails` uses of it before) so that the warp can zero its unwritten rows
// before publishing it.
__device__ __forceinline__ void load_half_blocks(const KvMaps& maps, const TileEntries& entries, int n, int head,
                                                 int tail_block, int tail_keys, unsigned char* smem,
                                                 const WgmmaBars& bar, int lane, int g0, int& tails) {
  using W = WgmmaTile;
  for (int i = 0; i < n; ++i) {
    const int g = g0 + i, s = ring_slot(g);
    const std::uint32_t parity = ring_parity(g) ^ 1u;  // the slot's previous use
    const int page = entries.page[i];
    const int c1 = map_coord(maps, 1, head, page), c2 = map_coord(maps, 2, head, page),
              c3 = map_coord(maps, 3, head, page);
    const std::uint32_t k_dst = smem_u32(smem + W::kK + s * W::kPlaneBytes);
    const std::uint32_t v_dst = smem_u32(smem + W::kV + s * W::kPlaneBytes);
    if (lane == 0) {
      if (g >= W::kSlots) sm90::mbar_wait(bar.empty_k(s), parity);
      sm90::mbar_arrive_expect_tx(bar.full_k(s), W::kPlaneBytes);
      sm90::tma_load_4d(k_dst, &maps.k, bar.full_k(s), 0, c1, c2, c3);
      sm90::tma_load_4d(k_dst + W::kAtomBytes, &maps.k, bar.full_k(s), 64, c1, c2, c3);
      if (g >= W::kSlots) sm90::mbar_wait(bar.empty_v(s), parity);
    }
    __syncwarp();
    if (entries.block[i] == tail_block && tail_keys < kBlockKeys) {
      if (lane == 0) {
        sm90::mbar_arrive_expect_tx(bar.tail(), W::kPlaneBytes);
        sm90::tma_load_4d(v_dst, &maps.v, bar.tail(), 0, c1, c2, c3);
        sm90::tma_load_4d(v_dst + W::kAtomBytes, &maps.v, bar.tail(), 64, c1, c2, c3);
      }
      sm90::mbar_wait(bar.tail(), std::uint32_t(tails & 1));
      ++tails;
      zero_v_rows(smem + W::kV + s * W::kPlaneBytes, tail_keys, lane);
      __syncwarp();
      if (lane == 0) sm90::mbar_arrive(bar.full_v(s));
    } else if (lane == 0) {
      sm90::mbar_arrive_expect_tx(bar.full_v(s), W::kPlaneBytes);
      sm90::tma_load_4d(v_dst, &maps.v, bar.full_v(s), 0, c1, c2, c3);
      sm90::tma_load_4d(v_dst + W::kAtomBytes, &maps.v, bar.full_v(s), 64, c1, c2, c3);
    }
  }
}

// Widens row r of an fp8 K or V slot in place: the raw row (128 codes at
// slot + kAtomBytes + 128 r, where the TMA put it: the slot's upper half) to
// the MMA type in the swizzled layout, dims 0-63 into the lower half, dims
// 64-127 over the raw rows. The second half lands exactly on raw row r, which
// this thread has read by then; no other row is touched. zero: a zero row.
template <KvKind kKind, bool kF16>
__device__ __forceinline__ void widen_row(unsigned char* slot, int r, bool zero) {
  const unsigned char* raw = slot + WgmmaTile::kAtomBytes + r * 128;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint4 in[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      in[j] = zero ? make_uint4(0, 0, 0, 0) : *reinterpret_cast<const uint4*>(raw + 64 * half + 16 * j);
#pragma unroll
    for (int c = 0; c < 8; ++c) {  // 16-byte output chunk c: codes 8c .. 8c + 7 of this half
      const std::uint32_t lo = (c & 1) ? in[c >> 1].z : in[c >> 1].x;
      const std::uint32_t hi = (c & 1) ? in[c >> 1].w : in[c >> 1].y;
      auto widen = [](std::uint32_t two) {
        const auto codes = std::uint16_t(two);
        return f16x2_to_mma<kF16>(kKind == KvKind::e4m3 ? e4m3x2_to_f16x2(codes) : e5m2x2_to_f16x2(codes));
      };
      const uint4 out = make_uint4(widen(lo & 0xffffu), widen(lo >> 16), widen(hi & 0xffffu), widen(hi >> 16));
      *reinterpret_cast<uint4*>(slot + half * WgmmaTile::kAtomBytes + r * 128 + ((c ^ (r & 7)) << 4)) = out;
    }
  }
}

// fp8 producer (the whole warpgroup, ptid 0..127), one tile after g0 blocks:
// its thread 0 loads the raw K and V tiles of each block by TMA into the
// slots' upper halves (K(i + 1) as soon as its slot is free, V(i + 1) once
// V(i) is published, so that no wait closes a cycle with the consumers), every
// thread widens one K row and one V row per block (the tail block's V rows
// past the last position read as zero), and K and V are published apart.
template <KvKind kKind, bool kF16>
__device__ __forceinline__ void widen_fp8_blocks(const KvMaps& maps, const TileEntries& entries, int n, int head,
                                                 int tail_block, int tail_keys, unsigned char* smem,
                                                 const WgmmaBars& bar, int ptid, int g0) {
  using W = WgmmaTile;
  constexpr int kRawBytes = kBlockKeys * kDim;  // 16 KiB of codes per tile
  auto issue = [&](int plane, int i) {          // thread 0 only
    const int g = g0 + i, s = ring_slot(g);
    const std::uint32_t raw_bar = plane ? bar.raw_v(s) : bar.raw_k(s);
    if (g >= W::kSlots) sm90::mbar_wait(plane ? bar.empty_v(s) : bar.empty_k(s), ring_parity(g) ^ 1u);
    const int page = entries.page[i];
    sm90::mbar_arrive_expect_tx(raw_bar, kRawBytes);
    sm90::tma_load_4d(smem_u32(smem + (plane ? W::kV : W::kK) + s * W::kPlaneBytes + W::kAtomBytes),
                      plane ? &maps.v : &maps.k, raw_bar, 0, map_coord(maps, 1, head, page),
                      map_coord(maps, 2, head, page), map_coord(maps, 3, head, page));
  };
  if (ptid == 0 && n > 0) {
    issue(0, 0);
    issue(1, 0);
  }
  for (int i = 0; i < n; ++i) {
    const int g = g0 + i, s = ring_slot(g);
    const std::uint32_t parity = ring_parity(g);
    if (ptid == 0 && i + 1 < n) issue(0, i + 1);
    sm90::mbar_wait(bar.raw_k(s), parity);
    widen_row<kKind, kF16>(smem + W::kK + s * W::kPlaneBytes, ptid, false);
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(W::kWidenBar, 128);
    if (ptid == 0) sm90::mbar_arrive(bar.full_k(s));
    sm90::mbar_wait(bar.raw_v(s), parity);
    widen_row<kKind, kF16>(smem + W::kV + s * W::kPlaneBytes, ptid,
                           entries.block[i] == tail_block && ptid >= tail_keys);
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(W::kWidenBar, 128);
    if (ptid == 0) {
      sm90::mbar_arrive(bar.full_v(s));
      if (i + 1 < n) issue(1, i + 1);
    }
  }
}

// Plans tile number `tile` (tile_of_cta) into plan buffer b: its header, token
// positions and union list, and its query rows (converted to the MMA type)
// in Q buffer b, where the union's scratch lives until the rows overwrite it.
// kWorkers threads (w in [0, kWorkers), whole warps) run it, `sync` joins
// them; the caller publishes the plan.
template <bool kF16, int kWorkers, class Sync>
__device__ __forceinline__ void plan_tile(const AttendParams& p, std::int64_t tile, unsigned char* smem, int b,
                                          int w, int lane, Sync sync) {
  using W = WgmmaTile;
  static_assert(kWorkers >= kTileMaxTokens, "a worker per tile token");
  const TileWork t = tile_of_cta(p, tile, lane);
  unsigned char* plan = smem + W::kPlans + b * W::kPlanBytes;
  unsigned char* list = plan + W::kHeaderBytes;
  unsigned char* q = smem + W::kQ + b * W::kQBuf;
  auto* header = reinterpret_cast<std::int32_t*>(plan);
  auto* pos = reinterpret_cast<std::int32_t*>(list + TileList::kPos);
  if (w < t.count) pos[w] = token_position(t.first + w, t.seq, t.q0, t.q1);
  sync();
  const int n = t.request >= 0 ? build_union_with<kWorkers>(p, t, q, list, w, sync) : 0;
  if (w == 0) {
    int max_pos = -1;
    for (int tok = 0; tok < t.count; ++tok) max_pos = max(max_pos, pos[tok]);
    const int tail_block = max_pos >= 0 ? max_pos / kBlockKeys : -1;
    header[PlanHeader::kRequest] = t.request;
    header[PlanHeader::kFirst] = t.first;
    header[PlanHeader::kCount] = t.count;
    header[PlanHeader::kHead] = t.head;
    header[PlanHeader::kEntries] = n;
    header[PlanHeader::kTailBlock] = tail_block;
    header[PlanHeader::kTailKeys] = max_pos - tail_block * kBlockKeys + 1;
  }
  // The rows, over the union's scratch (every planner is past it: the builder ends with a sync).
  if (t.count > 0) stage_wgmma_query<kF16, kWorkers>(p, t, q, w);
  sm90::fence_proxy_async();  // the Q tiles are read by wgmma (async proxy)
  sync();
}

// The plan buffer of the CTA's j-th tile.
__device__ __forceinline__ int plan_buffer(int j) { return j & 1; }

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
