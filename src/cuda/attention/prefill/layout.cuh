// Layout of the wgmma token-tile kernel (prefill/kernel.cuh): its roles
// and register split, the shared-memory map (plan buffers with their query
// rows and tile lists, the K and V rings, the mbarriers), the plan header, the
// named barriers, and the ring / plan-buffer indexing.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/attention/shared/tile_scheduler.cuh"
#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

// Shape and shared-memory layout (byte offsets from the 1 KiB-aligned base).
struct WgmmaTile {
  static constexpr int kConsumers = 2;                     // warpgroups of 64 rows
  static constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
  static constexpr int kProducerWarp = kConsumers * 4;     // streams K / V (bf16 / fp16)
  static constexpr int kPlanners = 96;                     // the producer's other three warps
  // Registers per thread after the split (setmaxnreg) out of the kernel's 168
  // per thread (64K over 384 threads, in steps of 8; both splits use all of
  // them): the producer plans tiles, and for fp8 / nvfp4 widens rows too
  // (with per-token scales also copying them); counts with which ptxas spills
  // nothing on either side.
  static constexpr int producer_regs(KvKind kind) { return kv_format(kind).tile_producer_regs; }
  static constexpr int consumer_regs(KvKind kind) { return kv_format(kind).tile_consumer_regs; }
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
  // raw K [2], raw V [2] (fp8), the first tile's query rows (TMA)
  static constexpr int kBars = kV + kSlots * kPlaneBytes;
  // Plan buffers [2]: the tile's header (int32 [8], PlanHeader) then its TileList.
  static constexpr int kPlans = kBars + 256;
  static constexpr int kHeaderBytes = 32;
  static constexpr int kPlanBytes = (kHeaderBytes + TileList::kBytes + 127) / 128 * 128;
  // fp8 per-token scales of the ring's blocks: float [kSlots][2 (K, V)][128]
  // (indexed by the K slot).
  static constexpr int kScales = kPlans + 2 * kPlanBytes;
  static constexpr int kSlotScaleBytes = 2 * kBlockKeys * 4;
  static constexpr int kBytes = kScales + kSlots * kSlotScaleBytes + 1024;  // + alignment slack
  // Named barriers: 0 is __syncthreads; warpgroup w waits on kTurn + w for its
  // turn to issue; the producer warpgroup (fp8 widening) syncs on kWidenBar,
  // the planners on kPlanBar; consumer warpgroup w stages its output rows on
  // kStageBar + w. Plan buffer b is handed over on kPlanFull + b
  // (the planners arrive, the consumers and the first producer warp wait) and
  // handed back on kPlanFree + b (the consumers arrive, the planners wait).
  static constexpr int kTurn = 1;
  static constexpr int kWidenBar = 3;
  static constexpr int kPlanBar = 4;
  static constexpr int kPlanFull = 5;
  static constexpr int kPlanFree = 7;
  static constexpr int kStageBar = 9;  // + wg: a consumer warpgroup's 128 threads (staged output rows)
  static constexpr int kPlanFullThreads = kThreads;                    // 96 + 256 + 32
  static constexpr int kPlanFreeThreads = kConsumers * 128 + kPlanners;  // 256 + 96
  static_assert(kBytes <= 227 * 1024, "shared memory beyond the sm_90 limit");
  // Arrivals that publish a slot (full) and release it (empty). Normally one
  // thread of the producer after the warpgroup's barrier, and one lane of each
  // consumer warp after __syncwarp. With fp8 per-token scales (`every_thread`)
  // the slot's scale array is written and read by plain stores and loads, and
  // every thread arrives itself, so that each access is ordered by that
  // thread's own release and acquire (the form compute-sanitizer's racecheck
  // follows: it does not carry a warp or warpgroup barrier into an mbarrier).
  static constexpr int full_arrivals(bool every_thread) { return every_thread ? 128 : 1; }
  static constexpr int empty_arrivals(bool every_thread) { return kConsumers * (every_thread ? 128 : 4); }
  static_assert(kK % 1024 == 0 && kPlaneBytes % 1024 == 0, "swizzled tiles need 1 KiB alignment");
  static_assert(UnionScratch::kBytes <= kQBuf, "the union scratch lives in the next tile's Q buffer");
};
static_assert(WgmmaTile::producer_regs(KvKind::half) + 2 * WgmmaTile::consumer_regs(KvKind::half) <= 3 * 168 &&
                  WgmmaTile::producer_regs(KvKind::e4m3) + 2 * WgmmaTile::consumer_regs(KvKind::e4m3) <= 3 * 168,
              "the register split exceeds the CTA's 168 registers per thread");

// Whether every thread arrives on the ring's slot barriers
// (WgmmaTile::full_arrivals): fp8 caches with per-token scales, the only ones
// with k_scales (attend.cu). Read from the kernel parameter at each use, so
// that it holds no register.
__device__ __forceinline__ bool every_thread_arrives(const AttendParams& p) { return p.cache.k_scales != nullptr; }

// What the planners tell the other roles about a tile (int32 [8] at the plan buffer's start).
struct PlanHeader {
  static constexpr int kRequest = 0;    // -1: the tile number has no tile
  static constexpr int kFirst = 1;      // first token
  static constexpr int kCount = 2;      // tokens
  static constexpr int kHead = 3;       // KV head
  static constexpr int kEntries = 4;    // union entries
  static constexpr int kTailBlock = 5;  // block of the tile's last position, or -1
  static constexpr int kTailKeys = 6;   // keys of that block any row sees
  static constexpr int kSplit = 7;      // split tiles: the item's share of the union (0 otherwise)
};

// Map coordinate of dimension `dim` (1..3) for (head, page); the token axis starts at 0.
__device__ __forceinline__ int map_coord(const KvMaps& m, int dim, int head, int page) {
  return dim == m.head_dim ? head : dim == m.page_dim ? page : 0;
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
  __device__ std::uint32_t q_rows() const { return base + 104u; }  // the first tile's query rows landed (TMA)
};

// Byte offset of chunk c (elements 8c .. 8c + 7) of tile row `row` in a Q
// buffer: the warpgroup's 64 rows as two 128-byte-swizzled atoms of 64 dims.
__device__ __forceinline__ int wgmma_q_offset(int row, int c) {
  const int wg = row >> 6, r = row & 63;
  return wg * WgmmaTile::kQBytes + (c >> 3) * WgmmaTile::kQAtomBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// Slot and phase parity of the CTA's g-th streamed block (counted over its tiles).
__device__ __forceinline__ int ring_slot(int g) { return g % WgmmaTile::kSlots; }
__device__ __forceinline__ std::uint32_t ring_parity(int g) { return std::uint32_t((g / WgmmaTile::kSlots) & 1); }

// The plan buffer of the CTA's j-th tile.
__device__ __forceinline__ int plan_buffer(int j) { return j & 1; }

}  // namespace msa::cuda::attention
