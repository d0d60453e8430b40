// Tile loads of the attention kernels: one selected block (128 keys of one KV
// head) from the paged cache into shared memory with 16-byte cp.async, and for
// fp8 / nvfp4 caches the widening of the stored codes to the MMA type (the
// mma.sync token-tile kernel; the row kernel converts in registers instead).
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

#include "cuda/common/fp4_fragments.hpp"
#include "cuda/common/fp8_fragments.hpp"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"
#include "msa/numeric.hpp"

namespace msa::cuda::attention {

// L: the kernel's SmemLayout; kNumThreads: the CTA's threads (a multiple of 128);
// kStream: K / V blocks are read once per launch (the row kernel: each
// (row, split) reads its own blocks), so their copies carry the L2
// evict-first policy.
template <KvKind kKind, bool kF16, class L = SmemLayout<kKind>, int kNumThreads = kThreads, bool kStream = false>
struct Stager {
  static_assert(kNumThreads % kBlockKeys == 0, "a thread per key for the scales");
  static constexpr KvFormat kFormat = kv_format(kKind);
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

  // nvfp4: the table byte -> (e2m1(low nibble), e2m1(high nibble)) in the MMA type.
  __device__ void build_lut() const {
    if constexpr (kFormat.fp4) {
      auto* lut = reinterpret_cast<std::uint32_t*>(smem + L::kLut);
      for (int b = tid; b < 256; b += kNumThreads)
        lut[b] = pack2<kF16>(num::e2m1_to_float(std::uint8_t(b & 15)),
                             num::e2m1_to_float(std::uint8_t(b >> 4)));
    }
  }

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
    if constexpr (!kFormat.converted) {
      const std::int64_t base = p.cache.offset(page, head, 0, 0);
      const unsigned char* k = static_cast<const unsigned char*>(p.cache.k) + base * 2;
      const unsigned char* v = static_cast<const unsigned char*>(p.cache.v) + base * 2;
      const std::int64_t tstride = p.cache.token_stride * 2;
#pragma unroll 4
      for (int i = 0; i < kBlockKeys * 16 / kNumThreads; ++i) {
        const int id = tid + i * kNumThreads;
        const int token = id >> 4, c = id & 15;
        const int bytes = token < valid_keys ? 16 : 0;
        const std::int64_t off = bytes ? token * tstride + c * 16 : 0;
        copy16(dst + tile_offset(token, c), k + off, bytes);
        copy16(dst + kTileBytes + tile_offset(token, c), v + off, bytes);
      }
    } else if constexpr (kFormat.fp4) {
      // K slot then V slot: one contiguous run of 2 x 9216 bytes.
      const unsigned char* src = static_cast<const unsigned char*>(p.cache.k) + nvfp4::slot_offset(p.cache, page, head, 0);
      constexpr int kChunks = 2 * kNvfp4SlotBytes / 16;
#pragma unroll 3
      for (int i = 0; i < (kChunks + kNumThreads - 1) / kNumThreads; ++i) {
        const int id = tid + i * kNumThreads;
        if (kChunks % kNumThreads != 0 && id >= kChunks) break;
        // Chunks [0, 512) are data (4 per token, swizzled as
        // fp4f::raw_offset), [512, 576) scales (2 tokens each, the second
        // token's half zero-filled past valid_keys); the same for V from 576.
        const int v = id < 576 ? 0 : 1;
        const int in_slot = id - 576 * v;
        const bool data = in_slot < 512;
        const int token = data ? in_slot >> 2 : (in_slot - 512) * 2;
        const int bytes = token >= valid_keys ? 0 : data || token + 1 < valid_keys ? 16 : 8;
        const int at = v * kNvfp4SlotBytes + (data ? fp4f::raw_offset(token, in_slot & 3) : in_slot * 16);
        copy16(dst + std::uint32_t(at), src + (bytes ? id * 16 : 0), bytes);
      }
    } else {
      const std::int64_t base = p.cache.offset(page, head, 0, 0);
      const unsigned char* k = static_cast<const unsigned char*>(p.cache.k) + base;
      const unsigned char* v = static_cast<const unsigned char*>(p.cache.v) + base;
#pragma unroll 4
      for (int i = 0; i < kBlockKeys * 8 / kNumThreads; ++i) {
        const int id = tid + i * kNumThreads;
        const int token = id >> 3, c = id & 7;
        const int bytes = token < valid_keys ? 16 : 0;
        const std::int64_t off = bytes ? token * p.cache.token_stride + c * 16 : 0;
        const auto at = std::uint32_t(fp8f::raw_offset(token, c));  // swizzled 16-byte chunks
        copy16(dst + at, k + off, bytes);
        copy16(dst + kFp8RawBytes + at, v + off, bytes);
      }
      if (p.cache.k_scales != nullptr && tid < kBlockKeys) {
        const std::uint32_t sdst = smem_u32(smem + L::kRawScales + stage * 2 * kBlockKeys * 4);
        const int token = tid;
        const int bytes = token < valid_keys ? 4 : 0;
        const std::int64_t at = bytes ? (page * kBlockKeys + token) * p.num_kv_heads + head : 0;
        cp_async4_zfill(sdst + token * 4, p.cache.k_scales + at, bytes);
        cp_async4_zfill(sdst + (kBlockKeys + token) * 4, p.cache.v_scales + at, bytes);
      }
    }
  }

  // Widens raw stage `stage` into the tile (converted kinds; no-op for half).
  // Call after the stage's copies landed and a __syncthreads.
  __device__ void widen(int stage, int valid_keys) const {
    if constexpr (kFormat.fp8) {
      const unsigned char* raw = smem + L::kRaw + stage * L::kRawBytes;
      unsigned char* tile = smem + L::kTile;
      // 16 codes (8 bytes) per (tensor, token, 8-dim chunk); keys past
      // valid_keys were zero-filled by issue(), so they widen to zeros. Each
      // thread loads a batch of codes before converting and storing any: the
      // compiler cannot tell the raw stage from the tile, so a load after a
      // store waits for it, and one load per store serialized the widening
      // (H200: fp8 decode 23-37% faster from batch 32). The
      // nvfp4 branch below keeps one load per store: batching its loads
      // (its table lookups depend on them) measured 0-6% slower.
      constexpr int kIters = 2 * kBlockKeys * 16 / kNumThreads;
      constexpr int kBatch = kIters < 8 ? kIters : 8;
      static_assert(kIters % kBatch == 0, "whole batches");
#pragma unroll 1
      for (int i0 = 0; i0 < kIters; i0 += kBatch) {
        uint2 codes[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int id = tid + (i0 + j) * kNumThreads;
          const int tensor = id >> 11, token = (id >> 4) & 127, c = id & 15;
          codes[j] = *reinterpret_cast<const uint2*>(raw + tensor * kFp8RawBytes + fp8f::raw_offset(token, c >> 1) +
                                                     (c & 1) * 8);
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const int id = tid + (i0 + j) * kNumThreads;
          const int tensor = id >> 11, token = (id >> 4) & 127, c = id & 15;
          const uint4 o = make_uint4(widen_fp8(std::uint16_t(codes[j].x & 0xffffu)),
                                     widen_fp8(std::uint16_t(codes[j].x >> 16)),
                                     widen_fp8(std::uint16_t(codes[j].y & 0xffffu)),
                                     widen_fp8(std::uint16_t(codes[j].y >> 16)));
          *reinterpret_cast<uint4*>(tile + tensor * kTileBytes + tile_offset(token, c)) = o;
        }
      }
      if (p.cache.k_scales != nullptr && tid < kBlockKeys) {
        const float* raw_scales = reinterpret_cast<const float*>(smem + L::kRawScales) + stage * 2 * kBlockKeys;
        float* cur = reinterpret_cast<float*>(smem + L::kCurScales);
        const bool ok = tid < valid_keys;
        cur[tid] = ok ? raw_scales[tid] : 0.0f;
        cur[kBlockKeys + tid] = ok ? raw_scales[kBlockKeys + tid] : 0.0f;
      }
    } else if constexpr (kFormat.fp4) {
      const unsigned char* raw = smem + L::kRaw + stage * L::kRawBytes;
      unsigned char* tile = smem + L::kTile;
      const auto* lut = reinterpret_cast<const std::uint32_t*>(smem + L::kLut);
#pragma unroll 2
      for (int i = 0; i < 2 * kBlockKeys * 4 / kNumThreads; ++i) {
        const int id = tid + i * kNumThreads;
        const int tensor = id >> 9, token = (id >> 2) & 127, quarter = id & 3;
        const unsigned char* slot = raw + tensor * kNvfp4SlotBytes;
        unsigned char* row = tile + tensor * kTileBytes;
        if (token >= valid_keys) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            *reinterpret_cast<uint4*>(row + tile_offset(token, 4 * quarter + j)) = make_uint4(0, 0, 0, 0);
          continue;
        }
        const uint4 d = *reinterpret_cast<const uint4*>(slot + fp4f::raw_offset(token, quarter));
        const std::uint16_t sc = *reinterpret_cast<const std::uint16_t*>(slot + 8192 + token * 8 + quarter * 2);
        const std::uint32_t sf = f16x2_to_mma<kF16>(e4m3x2_to_f16x2(sc));
        const std::uint32_t s0 = (sf & 0xffffu) * 0x10001u;  // group 2*quarter, both halves
        const std::uint32_t s1 = (sf >> 16) * 0x10001u;      // group 2*quarter + 1
        const std::uint32_t words[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const std::uint32_t wd = words[j];
          const std::uint32_t s = j < 2 ? s0 : s1;
          uint4 o;
          o.x = mul2<kF16>(lut[wd & 0xffu], s);
          o.y = mul2<kF16>(lut[(wd >> 8) & 0xffu], s);
          o.z = mul2<kF16>(lut[(wd >> 16) & 0xffu], s);
          o.w = mul2<kF16>(lut[wd >> 24], s);
          *reinterpret_cast<uint4*>(row + tile_offset(token, 4 * quarter + j)) = o;
        }
      }
    }
  }

 private:
  __device__ static std::uint32_t widen_fp8(std::uint16_t two_codes) {
    return fp8x2_to_mma<kKind, kF16>(two_codes);
  }
};

}  // namespace msa::cuda::attention
