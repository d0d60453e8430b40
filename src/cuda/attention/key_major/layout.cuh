// Layout of the key-major kernel (key_major/kernel.cuh): its roles, the
// shared-memory map (a ring of query-row buffers, each with its item's
// tokens, and a ring of K / V slots), the mbarriers, the named barriers.
#pragma once

#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/kv_format.hpp"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

// What the loaders tell the consumers about the item in a Q buffer.
struct KeyMajorInfo {
  std::int32_t count;      // tokens (rows count x G)
  std::int32_t head;       // KV head
  std::int32_t block;      // logical block of the request
  std::int32_t kv;         // the CTA's K / V load that holds the block, or -1: its page is bad (nothing runs)
  std::int32_t last;       // 1: the CTA's last item on that load (its consumers release the slot)
  std::int32_t pad[3];
  std::int32_t token[kTileMaxTokens];  // query token of item token t
  std::int32_t pos[kTileMaxTokens];    // its position, or -1
  std::uint8_t slot[kTileMaxTokens];   // its top-k slot (< 64)
};

struct KeyMajorTile {
  static constexpr int kConsumers = 2;                     // warpgroups of 64 rows
  static constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
  static constexpr int kStreamerWarp = kConsumers * 4;     // K / V loads (the producer's first warp)
  static constexpr int kLoaders = 96;                      // the producer's other three warps: a Q buffer each
  static constexpr int kProducerRegs = kv_format(KvKind::half).tile_producer_regs;
  static constexpr int kConsumerRegs = kv_format(KvKind::half).tile_consumer_regs;
  static constexpr int kQBufs = 3;   // items in flight: each holds its rows from load to epilogue
  static constexpr int kKvSlots = 2;  // blocks in flight (a CTA's items keep a block for a run)
  static constexpr int kAtomBytes = kBlockKeys * 128;      // 16 KiB: 64 dims of 128 keys
  static constexpr int kPlaneBytes = 2 * kAtomBytes;       // 32 KiB: one K or V tile
  static constexpr int kQBytes = 64 * kDim * 2;            // 16 KiB: a warpgroup's 64 rows
  static constexpr int kQAtomBytes = 64 * 128;             // 8 KiB: 64 dims of 64 rows
  static constexpr int kQBuf = kConsumers * kQBytes;       // an item's 128 rows
  static constexpr int kQ = 0;                             // [kQBufs][kConsumers][2][64][64] MMA type
  static constexpr int kK = kQ + kQBufs * kQBuf;           // [kKvSlots][2][128][64]
  static constexpr int kV = kK + kKvSlots * kPlaneBytes;   // [kKvSlots][2][128][64]
  static constexpr int kBars = kV + kKvSlots * kPlaneBytes;
  static constexpr int kBarBytes = 8 * (2 * kQBufs + 3 * kKvSlots + 1);
  // An item's description per Q buffer (KeyMajorInfo).
  static constexpr int kInfo = kBars + kBarBytes;
  static constexpr int kBytes = kInfo + kQBufs * int(sizeof(KeyMajorInfo)) + 1024;  // + alignment slack
  // Named barriers (0 is __syncthreads): warpgroup w waits on kTurn + w for
  // its turn to issue; consumer warpgroup w stages its output rows on
  // kStageBar + w.
  static constexpr int kTurn = 1;
  static constexpr int kStageBar = 3;
  static constexpr int kTurnPeers = kConsumers * 128;
  static_assert(kK % 1024 == 0 && kQBuf % 1024 == 0, "swizzled tiles need 1 KiB alignment");
};

static_assert(KeyMajorTile::kBytes <= 227 * 1024, "shared memory beyond the sm_90 limit");
static_assert(kMaxEntries <= 256, "top-k slots are stored in a byte");

// The kernel's mbarriers (shared addresses), 8 bytes each from KeyMajorTile::kBars.
struct KeyMajorBars {
  std::uint32_t base;
  // Q buffer b: its rows and description landed (its loader warp's 32 arrivals and the rows' bytes).
  __device__ std::uint32_t q_full(int b) const { return base + 8u * std::uint32_t(b); }
  // Q buffer b: its rows written out (every consumer thread arrives).
  __device__ std::uint32_t q_empty(int b) const { return base + 8u * std::uint32_t(KeyMajorTile::kQBufs + b); }
  __device__ std::uint32_t k_full(int s) const { return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + s); }
  __device__ std::uint32_t v_full(int s) const {
    return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + KeyMajorTile::kKvSlots + s);
  }
  // K / V slot s: read by the last item on it (one arrival per consumer warp).
  __device__ std::uint32_t kv_empty(int s) const {
    return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + 2 * KeyMajorTile::kKvSlots + s);
  }
  // The tail block's V tile landed (the streamer zeroes its unwritten rows, then publishes it).
  __device__ std::uint32_t tail() const { return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + 3 * KeyMajorTile::kKvSlots); }
};

}  // namespace msa::cuda::attention
