// Tile loads of the mma.sync kernels (the row kernel, the mma.sync token
// tiles): one selected block (128 keys of one KV head) from the paged cache
// into shared memory with 16-byte cp.async, and for fp8 / nvfp4 caches the
// widening of the stored codes to the MMA type (the token tiles; the row
// kernel converts in registers instead). Stager holds the CTA's stage
// addresses and scales; each format's copies and widening are its Staging
// (stage_half.cuh, stage_fp8.cuh, stage_fp4.cuh), named by Format (format.cuh).
//
// Keys past the row's causal limit (valid_keys) are never read: their 16-byte
// copies are zero-filled, and widening writes zeros for them, so NaN that may
// sit in unwritten cache slots cannot reach the products (0 * NaN = NaN).
//
// Widening is exact: e4m3, e5m2 and e2m1 x e4m3 products are all representable
// in bf16 and fp16. Per-tensor scales (and the nvfp4 global scales) are applied
// in fp32 outside the MMA; per-(token, head) fp8 scales are copied next to the
// tile and applied to the scores (K) and the probabilities (V).
#pragma once

#include <cstdint>

#include "cuda/attention/format.cuh"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/mma_sync/stage_fp4.cuh"
#include "cuda/attention/mma_sync/stage_fp8.cuh"
#include "cuda/attention/mma_sync/stage_half.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

// L: the kernel's SmemLayout; kNumThreads: the CTA's threads (a multiple of 128);
// kStream: K / V blocks are read once per launch (the row kernel: each
// (row, split) reads its own blocks), so their copies carry the L2
// evict-first policy.
template <KvKind kKind, bool kF16, class L = SmemLayout<kKind>, int kNumThreads = kThreads, bool kStream = false>
struct Stager {
  static_assert(kNumThreads % kBlockKeys == 0, "a thread per key for the scales");
  static constexpr KvFormat kFormat = kv_format(kKind);
  // What the per-format staging (stage_*.cuh) reads of the stager.
  using Layout = L;
  static constexpr int kCtaThreads = kNumThreads;
  static constexpr bool kF16Mma = kF16;
  static constexpr KvKind kKindValue = kKind;
  // The format's copies and widening.
  using Staging = typename Format<kKind>::Staging;
  unsigned char* smem;
  const AttendParams& p;
  int head;
  int tid;

  __device__ std::uint32_t k_tile(int stage) const {
    if constexpr (L::kWidened) return smem_u32(smem + L::kTile);
    else return smem_u32(smem + L::kRaw + stage * L::kRawBytes);
  }
  __device__ std::uint32_t v_tile(int stage) const { return k_tile(stage) + kTileBytes; }
  // Raw K / V planes of a stage: fp8 [128 keys][128 codes] (fp8_fragments.hpp),
  // nvfp4 slots [128 keys][64 bytes] + [128 keys][8 scales] (fp4_fragments.hpp).
  __device__ std::uint32_t raw_k(int stage) const { return smem_u32(smem + L::kRaw + stage * L::kRawBytes); }
  __device__ const unsigned char* raw_k_bytes(int stage) const { return smem + L::kRaw + stage * L::kRawBytes; }
  __device__ std::uint32_t raw_v(int stage) const {
    return raw_k(stage) + kFormat.plane_bytes;
  }
  // The per-token scales a stage holds as copied (keys past the valid ones
  // zero-filled), for the raw fp8 path; null without per-token scales.
  //   [128] K scales, then [128] V scales
  __device__ const float* stage_scales(int stage) const {
    if constexpr (!kTokenScales) return nullptr;
    return p.cache.k_scales != nullptr ? reinterpret_cast<const float*>(smem + L::kRawScales) + stage * 2 * kBlockKeys
                                 : nullptr;
  }
  // Per-token scales in use (fp8 per_token_head), else null.
  //   [128] floats each
  // Only fp8 caches have them: for the other kinds the null is a compile-time
  // constant, so the mainloop carries no scale loads.
  static constexpr bool kTokenScales = kFormat.fp8;
  __device__ const float* k_token_scales() const {
    if constexpr (!kTokenScales) return nullptr;
    return p.cache.k_scales != nullptr ? reinterpret_cast<const float*>(smem + L::kCurScales) : nullptr;
  }
  __device__ const float* v_token_scales() const {
    if constexpr (!kTokenScales) return nullptr;
    return p.cache.k_scales != nullptr ? reinterpret_cast<const float*>(smem + L::kCurScales) + kBlockKeys
                                 : nullptr;
  }

  // nvfp4: the table the widening reads (stage_fp4.cuh); nothing for the others.
  __device__ void build_lut() const { Staging::build_lut(*this); }

  // Starts the copies of block `page` (keys [0, valid_keys) read, the rest
  // zero-filled) into raw stage `stage`.
  __device__ void issue(int stage, std::int64_t page, int valid_keys) const {
    const std::uint32_t dst = smem_u32(smem + L::kRaw + stage * L::kRawBytes);
    [[maybe_unused]] std::uint64_t policy = 0;
    if constexpr (kStream) policy = l2_evict_first();
    auto copy16 = [&](std::uint32_t to, const void* from, int bytes) {
      if constexpr (kStream) cp_async16_zfill(to, from, bytes, policy);
      else cp_async16_zfill(to, from, bytes);
    };
    Staging::issue(*this, dst, stage, page, valid_keys, copy16);
  }

  // Widens raw stage `stage` into the tile (converted kinds; no-op for half).
  // Call after the stage's copies landed and a __syncthreads.
  __device__ void widen(int stage, int valid_keys) const { Staging::widen(*this, stage, valid_keys); }
};

}  // namespace msa::cuda::attention
