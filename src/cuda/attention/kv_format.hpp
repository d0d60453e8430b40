// The KV cache formats of the attention kernels, in one table: how each is
// stored and staged, whether it is converted to the MMA type, which output
// dims the row kernel holds, and how many CTAs of each kernel family fit on an
// SM. Kernels and host code ask kv_format(kind) instead of comparing kinds;
// a new format is a KvKind, a row here, its conversion in shared/convert.cuh
// and its Format type (format.cuh), which names each kernel family's part
// for it (docs/DESIGN.md).
// Host and device code (constexpr only, no CUDA headers).
#pragma once

#include "msa/dtype.hpp"

namespace msa::cuda::attention {

inline constexpr int kBlockKeys = 128;    // keys per selected block (= page size)
inline constexpr int kDim = 128;          // head dim
inline constexpr int kRowBytes = kDim * 2;                 // 256: a 16-bit row of 128 dims
inline constexpr int kTileBytes = kBlockKeys * kRowBytes;  // 32 KiB: one 16-bit K or V tile
inline constexpr int kFp8RawBytes = kBlockKeys * kDim;     // 16 KiB: one fp8 K or V block
inline constexpr int kNvfp4SlotBytes = kBlockKeys * 72;    // 9216: one nvfp4 K or V slot

// How the KV cache is staged into shared memory.
enum class KvKind : int {
  half,   // bf16 / fp16 cache read as is (its dtype is the MMA dtype)
  e4m3,   // fp8 e4m3 codes, widened to the MMA dtype while staging
  e5m2,   // fp8 e5m2 codes, widened likewise
  nvfp4,  // e2m1 codes x e4m3 group scales (contract 4.3), widened likewise
};

// Which dims the row kernel's output n-tiles hold (decode/epilogue.cuh): the
// MMA's natural order, or the permuted order of the fp8 / nvfp4 fragments
// (fp8_fragments.hpp, fp4_fragments.hpp).
enum class RowDims { natural, fp8, fp4 };

struct KvFormat {
  bool converted;        // stored codes are not the MMA type: widened or converted in registers
  bool fp8;              // one-byte codes (scales per tensor or per (token, head))
  bool fp4;              // nvfp4: e2m1 codes x e4m3 group scales, head-slot pages
  int plane_bytes;       // one staged K (or V) block as stored, in shared memory
  int row_ctas_per_sm;   // row (decode) kernel: fp8 / nvfp4 read raw stages, no widened tile
  RowDims row_dims;      // the row kernel's output dims
  bool row_push_merge;   // row kernel's push area in [extra] (raw fp8: over its scales, RowLayout)
  int tile_producer_regs;  // wgmma token tiles: setmaxnreg of the producer warpgroup
  int tile_consumer_regs;  // ... and of each consumer warpgroup
};

inline constexpr KvFormat kv_format(KvKind k) {
  switch (k) {
    case KvKind::half:
      return {false, false, false, kTileBytes, 1, RowDims::natural, true, 72, 216};
    case KvKind::e4m3:
    case KvKind::e5m2:
      return {true, true, false, kFp8RawBytes, 2, RowDims::fp8, false, 88, 208};
    case KvKind::nvfp4:
      return {true, false, true, kNvfp4SlotBytes, 2, RowDims::fp4, true, 88, 208};
  }
  return {};
}

// The kind that stages a cache dtype.
inline constexpr KvKind kv_kind(DType kv) {
  return kv == DType::fp8_e4m3 ? KvKind::e4m3
         : kv == DType::fp8_e5m2 ? KvKind::e5m2
         : kv == DType::nvfp4    ? KvKind::nvfp4
                                 : KvKind::half;
}

}  // namespace msa::cuda::attention
