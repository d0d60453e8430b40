// Query staging of the attention kernels. A query chunk is 8 elements of one
// query head; it is loaded raw and converted to the MMA type. The row kernel
// stages its 16-row query tile in two halves (RowQuery): the global loads are
// issued before the top-k scan, so that their round trip overlaps the scan's
// two, and the conversion and shared-memory stores come after it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/attention/decode/scheduler.cuh"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/attention/decode/query_scale.hpp"
#include "cuda/attention/shared/query.cuh"
#include "cuda/common/fp4_fragments.hpp"

namespace msa::cuda::attention {

// The raw bytes of 8 query elements: 16 B of a 16-bit query, or the 8 B of an
// e4m3 query in x and y.
//   p.q: [num_tokens, num_q_heads, 128]; elem: index of the first of the 8
__device__ __forceinline__ uint4 load_query_raw(const AttendParams& p, std::int64_t elem) {
  if (p.q_kind == kQueryE4m3) {
    const uint2 c = *reinterpret_cast<const uint2*>(static_cast<const unsigned char*>(p.q) + elem);
    return make_uint4(c.x, c.y, 0, 0);
  }
  return *reinterpret_cast<const uint4*>(static_cast<const std::uint16_t*>(p.q) + elem);
}

// load_query_raw's bytes as 8 elements of the MMA type (zero bytes give zeros).
template <bool kF16>
__device__ __forceinline__ uint4 query_raw_to_mma(const AttendParams& p, uint4 raw) {
  if (p.q_kind == kQueryE4m3) return e4m3x8_to_mma<kF16>(make_uint2(raw.x, raw.y));
  return half8_to_mma<kF16>(p.q_kind == kQueryFp16, raw);
}

// The largest |q| among 8 bf16 query elements and `bits`, as bf16 bits (sign cleared).
__device__ __forceinline__ std::uint32_t bf16x8_max_abs_bits(std::uint32_t bits, uint4 raw) {
  bits = qscale::max_abs_bits(bits, raw.x);
  bits = qscale::max_abs_bits(bits, raw.y);
  bits = qscale::max_abs_bits(bits, raw.z);
  return qscale::max_abs_bits(bits, raw.w);
}

// 8 bf16 query elements times `factor` (a power of two) as fp16.
__device__ __forceinline__ uint4 bf16x8_to_scaled_fp16(uint4 raw, float factor) {
  std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = pack2<true>(__uint_as_float(w[i] << 16) * factor, __uint_as_float(w[i] & 0xffff0000u) * factor);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The row kernel's query tile: the G query heads of (token, KV head) as rows
// 0..G-1 of a [16][128] swizzled tile of the MMA type, rows >= G zero. The
// rows of a row that attends nothing are loaded too (in bounds, never used).
// Which chunks a thread takes, and where they go, depend on how the kind's
// mainloop reads the tile:
//   half:    chunks tid and tid + 128 (row = idx / 16, chunk idx % 16), as stored;
//   raw fp8: the 16-dim group tid % 8 of row tid / 8, words permuted as
//            fp8f::q_source_word says (fp8_fragments.hpp);
//   nvfp4:   threads 0-63, the 32-dim chunk tid % 4 of row tid / 4, k-step
//            2c + h word m taken from word fp4f::q_source_word(h, m) (bf16
//            MMA) or from the halves h of words fp4f::q_source_pair(m) and
//            the next (fp16 MMA).
//
// With fp16 MMA, the raw kinds scale bf16 query rows (query_scale.hpp) and
// leave each row's factor 2^e in q_scale[row] (1 for the other query kinds).
template <KvKind kKind>
struct RowQuery {
  static constexpr bool kFp8 = kv_format(kKind).fp8;
  static constexpr bool kFp4 = kv_format(kKind).fp4;
  static constexpr int kLoads = kFp4 ? 4 : 2;
  // The rows of this kind and MMA type carry a scale (q_scale).
  template <bool kF16>
  static constexpr bool scaled() {
    return kv_format(kKind).converted && kF16;
  }
  static_assert(kRows * 16 == kThreads * 2 && kRows * 8 == kThreads, "chunks per thread");
  uint4 raw[kLoads];

  // Issues this thread's loads (no wait).
  __device__ __forceinline__ void load(const AttendParams& p, const RowWork& w, int tid) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) raw[j] = make_uint4(0, 0, 0, 0);
    const std::int64_t head0 = std::int64_t(w.token) * p.num_q_heads + std::int64_t(w.head) * p.group;
    if constexpr (kFp4) {
      const int row = tid >> 2, c = tid & 3;
      if (tid >= kRows * 4 || row >= p.group) return;
#pragma unroll
      for (int j = 0; j < 4; ++j) raw[j] = load_query_raw(p, (head0 + row) * kDim + 32 * c + 8 * j);
    } else if constexpr (kFp8) {
      const int row = tid >> 3, g = tid & 7;
      if (row >= p.group) return;
#pragma unroll
      for (int j = 0; j < 2; ++j) raw[j] = load_query_raw(p, (head0 + row) * kDim + 16 * g + 8 * j);
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int idx = tid + j * kThreads, row = idx >> 4, c = idx & 15;
        if (row < p.group) raw[j] = load_query_raw(p, (head0 + row) * kDim + 8 * c);
      }
    }
  }

  // Converts the loaded chunks and stores them in the tile.
  //   q_tile: [16][128] swizzled MMA-type rows (shared memory)
  //   q_scale: [16] the rows' score factors (shared memory; written when scaled<kF16>())
  template <bool kF16>
  __device__ __forceinline__ void store(const AttendParams& p, unsigned char* q_tile, float* q_scale, int tid) const {
    uint4 a[kLoads];
    if constexpr (scaled<kF16>()) {
      // A row's chunks are held by kGroup consecutive lanes (threads 0-63 for nvfp4).
      constexpr int kGroup = kFp4 ? 4 : 8;
      if (kFp4 && tid >= kRows * 4) return;
      const bool bf16_rows = p.q_kind == kQueryBf16;
      std::uint32_t m = 0;
      if (bf16_rows) {
#pragma unroll
        for (int j = 0; j < kLoads; ++j) m = bf16x8_max_abs_bits(m, raw[j]);
#pragma unroll
        for (int x = 1; x < kGroup; x <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, x));
      }
      const int e = qscale::row_exponent(m);  // 0 unless bf16_rows
      const float factor = qscale::pow2(-e);
#pragma unroll
      for (int j = 0; j < kLoads; ++j)
        a[j] = bf16_rows ? bf16x8_to_scaled_fp16(raw[j], factor) : query_raw_to_mma<kF16>(p, raw[j]);
      if (tid % kGroup == 0) q_scale[tid / kGroup] = qscale::pow2(e);
    } else {
#pragma unroll
      for (int j = 0; j < kLoads; ++j) a[j] = query_raw_to_mma<kF16>(p, raw[j]);
    }
    if constexpr (kFp4 && kF16) {
      if (tid >= kRows * 4) return;
      const int row = tid >> 2, c = tid & 3;
      // Word W of the chunk is a[W / 4]'s word W % 4. k-step 2c + h is tile
      // chunks 4c + 2h (words m = 0-3) and 4c + 2h + 1 (m = 4-7); word m is
      // the halves h of words W = q_source_pair(m) = 4 (m % 4) + 2 (m / 4)
      // and W + 1: a[m % 4]'s (x, y) for m < 4, its (z, w) for m >= 4.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::uint32_t sel = h ? fp4f::kPairHigh : fp4f::kPairLow;
        *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 4 * c + 2 * h)) =
            make_uint4(__byte_perm(a[0].x, a[0].y, sel), __byte_perm(a[1].x, a[1].y, sel),
                       __byte_perm(a[2].x, a[2].y, sel), __byte_perm(a[3].x, a[3].y, sel));
        *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 4 * c + 2 * h + 1)) =
            make_uint4(__byte_perm(a[0].z, a[0].w, sel), __byte_perm(a[1].z, a[1].w, sel),
                       __byte_perm(a[2].z, a[2].w, sel), __byte_perm(a[3].z, a[3].w, sel));
      }
    } else if constexpr (kFp4) {
      if (tid >= kRows * 4) return;
      const int row = tid >> 2, c = tid & 3;
      // Word W of the chunk is a[W / 4]'s word W % 4. k-step 2c + h is tile
      // chunks 4c + 2h (words m = 0-3: W = 4m + 2h) and 4c + 2h + 1 (m = 4-7:
      // W = 4 (m - 4) + 2h + 1), as q_source_word(h, m) says.
      *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 4 * c)) = make_uint4(a[0].x, a[1].x, a[2].x, a[3].x);
      *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 4 * c + 1)) = make_uint4(a[0].y, a[1].y, a[2].y, a[3].y);
      *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 4 * c + 2)) = make_uint4(a[0].z, a[1].z, a[2].z, a[3].z);
      *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 4 * c + 3)) = make_uint4(a[0].w, a[1].w, a[2].w, a[3].w);
    } else if constexpr (kFp8) {
      const int row = tid >> 3, g = tid & 7;
      // Words w0..w7 = (a0.x a0.y a0.z a0.w a1.x a1.y a1.z a1.w); word m <- w[q_source_word(m)].
      *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 2 * g)) = make_uint4(a[0].x, a[0].z, a[1].x, a[1].z);
      *reinterpret_cast<uint4*>(q_tile + tile_offset(row, 2 * g + 1)) = make_uint4(a[0].y, a[0].w, a[1].y, a[1].w);
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int idx = tid + j * kThreads;
        *reinterpret_cast<uint4*>(q_tile + tile_offset(idx >> 4, idx & 15)) = a[j];
      }
    }
  }
};

}  // namespace msa::cuda::attention
