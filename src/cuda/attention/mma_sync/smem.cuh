// Shared-memory layout of the attention kernels, per KV kind. Byte offsets from
// the start of the dynamic shared memory:
//
//   [q]      query tile of the MMA type (16 rows for the row kernel, 128 for
//            the token-tile kernel), rows of 256 B, swizzled
//   [meta]   the row's top-k ids, selected pages and block ids, counters, and
//            the per-warp softmax statistics used by the warp merge
//   [extra]  the token-tile kernel's tile metadata (shared/tile_scheduler.cuh);
//            the row kernel's push-merge receive area (PushArea)
//   [stage]  K/V staging. half: kStages stages of [K tile | V tile] (the tiles
//            themselves). fp8 / nvfp4: kStages raw stages (codes as stored),
//            the token-tile kernels' widened [K tile | V tile], per-token scales
//            / the nvfp4 table. nvfp4 raw stages swizzle their data chunks
//            (fp4_fragments.hpp).
//   The row kernel's epilogue reuses [stage] for the per-warp fp32 outputs.
//
// A tile is 128 keys x 128 dims of the MMA type: row = key, 256 B, the 16-byte
// chunk c of row r stored at chunk c ^ (r & 7) so that ldmatrix and the staging
// stores are free of bank conflicts.
#pragma once

#include <cstdint>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

inline constexpr int kMergeStride = kDim + 8;              // floats per row of the merge buffer

// Byte offset of chunk c (16 B) of row r in a swizzled tile.
__device__ __forceinline__ std::uint32_t tile_offset(int r, int c) {
  return std::uint32_t(r * kRowBytes + ((c ^ (r & 7)) << 4));
}

// kStages: K/V blocks in flight; kQRows: query rows; kExtraBytes: [extra];
// kWidenedT: converted kinds widen into a tile (else the raw stages are read
// directly: the row kernel's fp8 path, fp8_fragments.hpp); kTailBytes: bytes
// after the layout's end (the raw fp8 row kernel's push area, which overlays
// its per-token scales and runs on past them).
template <KvKind kKind, int kStagesT = 3, int kQRows = kRows, int kExtraBytes = 0, bool kWidenedT = true,
          int kTailBytes = 0>
struct SmemLayout {
  static constexpr KvFormat kFormat = kv_format(kKind);
  static constexpr bool kConverted = kFormat.converted;
  static constexpr bool kWidened = kConverted && kWidenedT;
  static constexpr int kStages = kStagesT;
  static constexpr int kQ = 0;
  static constexpr int kIds = kQ + kQRows * kRowBytes;       // int32 [64] raw top-k row
  static constexpr int kPages = kIds + kMaxEntries * 4;      // int32 [64] selected pages
  static constexpr int kBlocks = kPages + kMaxEntries * 4;   // int32 [64] their block ids
  static constexpr int kCount = kBlocks + kMaxEntries * 4;   // int32 [4]: selected count
  static constexpr int kWarpMax = kCount + 16;               // float [4][16]
  static constexpr int kWarpSum = kWarpMax + 4 * kRows * 4;  // float [4][16]
  static constexpr int kQScale = kWarpSum + 4 * kRows * 4;   // float [16]: query row scales (RowQuery)
  static constexpr int kCurScales = kQScale + kRows * 4;     // float [2][128]: K, V scales in use
  static constexpr int kExtra = kCurScales + 2 * kBlockKeys * 4;  // kExtraBytes, 16-byte aligned
  static constexpr int kStage = (kExtra + kExtraBytes + 127) / 128 * 128;

  // One raw stage (the tiles themselves for half).
  static constexpr int kRawBytes = 2 * kFormat.plane_bytes;
  static constexpr int kRaw = kStage;                              // [kStages][kRawBytes]
  static constexpr int kTile = kWidened ? kRaw + kStages * kRawBytes : kRaw;  // [K | V] widened
  static constexpr int kAfterTile = kWidened ? kTile + 2 * kTileBytes : kRaw + kStages * kRawBytes;
  static constexpr int kRawScales = kAfterTile;                    // fp8: float [kStages][2][128]
  static constexpr int kLut = kAfterTile;                          // nvfp4: uint32 [256]
  static constexpr int kBytes = (kFormat.fp4 ? kLut + 256 * 4
                                 : kConverted ? kRawScales + kStages * 2 * kBlockKeys * 4
                                              : kAfterTile) +
                                kTailBytes;
  static constexpr int kMergeBytes = 4 * kRows * kMergeStride * 4;
  // The row kernel's epilogue keeps its four warps' outputs in the stage area,
  // then a cluster split's [16][128] partial and [16] lse.
  static_assert(kMergeBytes + (kRows * kDim + kRows) * 4 <= kAfterTile - kStage,
                "merge buffers must fit in the stage area");
  static_assert(kExtra % 16 == 0 && kStages >= 2, "layout");
  static_assert(kBytes <= 227 * 1024, "shared memory beyond the sm_90 limit");
};

// The receive area of the row kernel's push merge (decode/push.cuh), in its
// [extra] region, byte offsets from the region's start:
//   [data] float [items owned][splits][8]: item j's chunk from split s
//   [lse]  float [splits][16]: each split's lse per head (natural log)
//   [bar]  the mbarrier the pushes complete
struct PushArea {
  static constexpr int kData = 0;
  static constexpr int kLse = kData + (kRows * 16 + kMaxClusterSplits) * 32;
  static constexpr int kBar = kLse + kMaxClusterSplits * kRows * 4;
  static constexpr int kBytes = kBar + 8;
  // An owner's items x splits <= 256 + splits - 1 chunks; every head row has
  // a chunk c < splits for each owner, which sends it the row's lse.
  static_assert(kMaxClusterSplits <= 16, "push merge: one lse sender per (row, owner)");
};
// The row kernel's layout: the push merge's receive area (kPush) in [extra]
// where the format has room for it; fp8 and nvfp4 read their raw stages with
// ldmatrix and convert in registers (fp8_fragments.hpp, fp4_fragments.hpp):
// no widened tile, so two CTAs fit on an SM (KvFormat::row_ctas_per_sm). Two
// raw fp8 CTAs have no room for a receive area of their own: theirs starts at
// the per-token scales of the raw stages and runs past the layout's end, so
// that only steps without per-token scales push (row_pushes); the others pull
// the partials (decode/combine.cuh). A launch that does not push leaves the
// tail out of its shared memory (row_smem_bytes).
template <KvKind kKind>
inline constexpr int kRowPushTail = kv_format(kKind).fp8 ? PushArea::kBytes - 3 * 2 * kBlockKeys * 4 : 0;
template <KvKind kKind>
using RowLayoutBase = SmemLayout<kKind, 3, kRows, kv_format(kKind).row_push_merge ? PushArea::kBytes : 0,
                                 !kv_format(kKind).converted, kRowPushTail<kKind>>;
template <KvKind kKind>
struct RowLayout : RowLayoutBase<kKind> {
  using Base = RowLayoutBase<kKind>;
  static constexpr int kPush = kv_format(kKind).fp8 ? Base::kRawScales : Base::kExtra;
  static constexpr int kPushTail = kRowPushTail<kKind>;  // bytes only a pushing launch needs
  static_assert(!kv_format(kKind).fp8 || (Base::kStages == 3 && kPush + PushArea::kBytes == Base::kBytes),
                "the raw fp8 push area ends with the layout");
};
static_assert(kv_format(KvKind::nvfp4).row_ctas_per_sm * (RowLayout<KvKind::nvfp4>::kBytes + 1024) <= 228 * 1024 &&
                  kv_format(KvKind::e4m3).row_ctas_per_sm * (RowLayout<KvKind::e4m3>::kBytes + 1024) <= 228 * 1024,
              "the row kernel's CTAs per SM must fit its shared memory");

}  // namespace msa::cuda::attention
