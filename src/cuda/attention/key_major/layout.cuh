// Layout of the key-major kernel (key_major/kernel.cuh): its roles, the
// shared-memory map (a ring of query-row buffers, each with its item's
// tokens, and a ring of K / V slots), the mbarriers, the named barriers.
#pragma once

#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

// Tokens an item holds at most: its kKeyMajorRows rows over G >= 2 (key-major
// runs on the wgmma token tiles, whose 128 rows are at most 64 tokens).
inline constexpr int kItemMaxTokens = kKeyMajorRows / 2;

// What the loaders tell the consumers about the item in a Q buffer.
struct KeyMajorInfo {
  std::int32_t count;      // tokens (rows count x G)
  std::int32_t head;       // KV head
  std::int32_t kv;         // the CTA's K / V load of the block
  std::int32_t good;       // 0: its page is bad (the load brings nothing, nothing runs)
  std::int32_t pad[4];
  std::int32_t token[kItemMaxTokens];  // query token of item token t
  std::uint8_t keys[kItemMaxTokens];   // its keys of the block: position - first key + 1, in [0, 128]
  std::uint8_t slot[kItemMaxTokens];   // its top-k slot (< 64)
};

// Each consumer warpgroup takes whole items of 64 rows (items i = w, w + C,
// ... of the CTA's run for warpgroup w of C), so that three chains of QK,
// softmax, PV and epilogue overlap on the tensor cores without waiting for
// each other.
struct KeyMajorTile {
  static constexpr int kConsumers = 3;                     // warpgroups, an item of 64 rows each at a time
  static constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup
  static constexpr int kStreamerWarp = kConsumers * 4;     // K / V loads (the producer's first warp)
  static constexpr int kLoaderWarps = 3;                   // the producer's other three warps
  static constexpr int kProducerRegs = 56;
  static constexpr int kConsumerRegs = 152;                // 56 x 128 + 152 x 384 <= 64 Ki
  // Items in flight: loader warp k fills buffers k, k + 3 and warpgroup w
  // drains buffers w, w + C, ...: six buffers make every buffer one loader's
  // and one warpgroup's, so that each mbarrier's phases advance in order.
  static constexpr int kQBufs = 6;
  static constexpr int kKvSlots = 2;  // blocks in flight (a CTA's items keep a block for a run)
  // Load g lands on full barriers g % kLoadBars. A warpgroup whose last item
  // read load l waits next for a load g <= l + 3, and every load up to l - 2
  // has landed by then (load l was issued once l - 2 was released): with six
  // barriers, g's barrier has finished the phase of load g - 6 and cannot
  // finish g + 6's before this warpgroup releases g, so its parity is exact.
  static constexpr int kLoadBars = 6;
  static constexpr int kAtomBytes = kBlockKeys * 128;      // 16 KiB: 64 dims of 128 keys
  static constexpr int kPlaneBytes = 2 * kAtomBytes;       // 32 KiB: one K or V tile
  static constexpr int kQBytes = 64 * kDim * 2;            // 16 KiB: a warpgroup's 64 rows
  static constexpr int kQAtomBytes = 64 * 128;             // 8 KiB: 64 dims of 64 rows
  static constexpr int kQBuf = kQBytes;                    // an item's 64 rows
  static constexpr int kQ = 0;                             // [kQBufs][2][64][64] MMA type
  static constexpr int kK = kQ + kQBufs * kQBuf;           // [kKvSlots][2][128][64]
  static constexpr int kV = kK + kKvSlots * kPlaneBytes;   // [kKvSlots][2][128][64]
  static constexpr int kBars = kV + kKvSlots * kPlaneBytes;
  static constexpr int kBarBytes = 8 * (2 * kQBufs + 2 * kLoadBars + kKvSlots + 1);
  // An item's description per Q buffer (KeyMajorInfo).
  static constexpr int kInfo = kBars + kBarBytes;
  static constexpr int kBytes = kInfo + kQBufs * int(sizeof(KeyMajorInfo)) + 1024;  // + alignment slack
  // A K / V slot's release counts kKvRelease arrivals: the streamer's
  // kKvRelease - 4 n for a block that n items of the run read, and one per
  // consumer warp and item (kKeyMajorRelease).
  static constexpr std::uint32_t kKvRelease = kKeyMajorRelease;
  // Named barriers (0 is __syncthreads): consumer warpgroup w stages its
  // output rows on kStageBar + w.
  static constexpr int kStageBar = 1;
  static_assert(kQBufs % kLoaderWarps == 0 && kQBufs % kConsumers == 0, "a buffer per loader and warpgroup");
  static_assert(kConsumers == 3 && kLoadBars >= 6 && kLoadBars % kKvSlots == 0, "full barriers per load (above)");
  static_assert(kK % 1024 == 0 && kQBuf % 1024 == 0, "swizzled tiles need 1 KiB alignment");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "registers beyond the SM's");
};

static_assert(KeyMajorTile::kBytes <= 227 * 1024, "shared memory beyond the sm_90 limit");
static_assert(kMaxEntries <= 256, "top-k slots are stored in a byte");

// The kernel's mbarriers (shared addresses), 8 bytes each from KeyMajorTile::kBars.
struct KeyMajorBars {
  std::uint32_t base;
  // Q buffer b: its rows and description landed (its loader warp's 32 arrivals and the rows' bytes).
  __device__ std::uint32_t q_full(int b) const { return base + 8u * std::uint32_t(b); }
  // Q buffer b: its rows written out (every thread of its warpgroup arrives).
  __device__ std::uint32_t q_empty(int b) const { return base + 8u * std::uint32_t(KeyMajorTile::kQBufs + b); }
  // Load g's K / V tiles landed in slot g % 2 (or, for a bad page, its streamer arrived): h = g % kLoadBars.
  __device__ std::uint32_t k_full(int h) const { return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + h); }
  __device__ std::uint32_t v_full(int h) const {
    return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + KeyMajorTile::kLoadBars + h);
  }
  // K / V slot s: read by every item on its load (KeyMajorTile::kKvRelease arrivals).
  __device__ std::uint32_t kv_empty(int s) const {
    return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + 2 * KeyMajorTile::kLoadBars + s);
  }
  // The tail block's V tile landed (the streamer zeroes its unwritten rows, then publishes it).
  __device__ std::uint32_t tail() const {
    return base + 8u * std::uint32_t(2 * KeyMajorTile::kQBufs + 2 * KeyMajorTile::kLoadBars + KeyMajorTile::kKvSlots);
  }
};

}  // namespace msa::cuda::attention
