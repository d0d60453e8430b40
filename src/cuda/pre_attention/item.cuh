// The per-item work of pre-attention (msa/pre_attention.hpp, contract 10),
// shared by its two kernels: the warps' kernel (pre_attention.cu), whose warps
// each fetch their own row parts, and the staged one (staged_kernel.cuh).
//
// An item is one head of one token, on 8 lanes (a group). Lane c holds the
// elements 8c .. 8c+7 and 64+8c .. 64+8c+7, so that the rotated half of a head
// (dims 0..63) is spread over all 8 lanes and RoPE pairs element j (lanes 0-3)
// with j + 32 (lanes 4-7) by one shuffle. A warp's four groups take one head of
// four consecutive tokens (a tile): every branch on the head's kind is uniform
// over the warp (no kind's quantizer waits for another's, and the norm's
// shuffles name the whole warp).
//
// Per item, in the order of the SEMANTICS: the sum of squares is each lane's
// two partials of 8 (p[c] and p[c + 8], added first, as the tree of src/core/
// pre_attention_math.hpp does) then an xor tree over the 8 lanes; the norm
// gains 1 + w of the four head kinds are computed once per block into shared
// memory; the result is rounded to the qkv dtype, and the stores are
// insert_store.cuh's, the very code of insert_kv / insert_index, so every
// cache dtype the inserts know is written here the same way (row reductions
// there are shuffles among the group's 8 lanes: tokens of a warp may skip
// their K / V).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/pre_attention_math.hpp"
#include "cuda/common/device_check.cuh"
#include "cuda/common/float_divisor.hpp"
#include "cuda/insert/insert_store.cuh"
#include "cuda/insert/insert_util.cuh"
#include "cuda/pre_attention/fast_divide.hpp"
#include "msa/cuda.hpp"
#include "msa/numeric.hpp"
#include "msa/pre_attention.hpp"

namespace msa::cuda::pre_detail {

using insert_detail::kDstBf16;
using insert_detail::kDstE4m3;
using insert_detail::kDstFp16;
using pre::HeadKind;

// Tags of the small tables' dtypes (norm weights, cos/sin).
constexpr int kTableF32 = 0;
constexpr int kTableBf16 = 1;
constexpr int kTableFp16 = 2;

constexpr int kLanes = 8;                   // lanes per (token, head) item
constexpr int kValues = kHeadDim / kLanes;  // 16 values per lane, two groups of 8
constexpr int kTileTokens = 32 / kLanes;    // tokens of a tile: a warp's groups

struct PreAttentionParams {
  KVCacheView cache;
  IndexCacheView index_cache;
  int index_tag = kDstBf16;               // insert_detail::index_dst_tag
  const std::uint16_t* qkv = nullptr;     // [num_tokens, row_stride] bf16/fp16 bits
  std::int64_t row_stride = 0;            // elements
  std::int64_t num_tokens = 0;
  std::uint32_t heads = 0;                // per token: nq + 2 * nkv + niq + 1
  // The warps' kernel's items (pre_attention.cu): tiles * heads * kTileTokens (< 2^31).
  FastDivisor by_tile;                    // item -> tile: heads * kTileTokens items each
  FastDivisor by_heads;
  std::uint32_t head_step = 1;            // the tile's j-th head is (j * head_step) % heads
  std::uint32_t items = 0;
  // The staged kernel's chunks (staged_kernel.cuh): a tile's heads in runs of chunk_heads.
  std::uint32_t chunk_heads = 0;
  FastDivisor by_tile_chunks;             // chunk -> tile: tile_chunks chunks each
  std::uint32_t tile_chunks = 1;
  std::uint32_t chunks = 0;               // tiles * tile_chunks
  std::int32_t nq = 0, nkv = 0, niq = 0;
  const std::int64_t* positions = nullptr;  // [num_tokens]
  const void* q_weight = nullptr;           // [128] each, weight_tag
  const void* k_weight = nullptr;
  const void* index_q_weight = nullptr;
  const void* index_k_weight = nullptr;
  int weight_tag = kTableF32;
  float eps = 0.0f;
  const void* cos_sin = nullptr;  // [max_position, 64] cos_sin_tag
  int cos_sin_tag = kTableF32;
  std::int64_t max_position = 0;
  void* q = nullptr;              // [num_tokens, nq * 128] q_tag
  int q_tag = kDstBf16;
  float q_scale = 1.0f;
  void* index_q = nullptr;        // [num_tokens, niq * 128] index_q_tag
  int index_q_tag = kDstBf16;
  const std::int64_t* slots = nullptr;        // [num_tokens]
  const std::int64_t* index_slots = nullptr;  // [num_tokens] (the main slots when none are given)
  std::int64_t* check = nullptr;              // [8] DeviceCheck buffer or null
};

inline int table_tag(DType t) {
  return t == DType::f32 ? kTableF32 : t == DType::bf16 ? kTableBf16 : kTableFp16;
}

// ---- conversions --------------------------------------------------------------------
// bf16 / fp16 -> float is exact; float -> bf16 / fp16 rounds to nearest even
// with the hardware's paired conversion, NaN as 0x7FFF (insert_util.cuh's
// half2_codes; NaN payloads never reach an output: every encoder maps any NaN
// to one code).
template <int Src>
__device__ __forceinline__ float2 half2_to_float2(std::uint32_t w) {
  if constexpr (Src == insert_detail::kSrcBf16) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  } else {
    __half2 h;
    static_assert(sizeof(h) == sizeof(w));
    memcpy(&h, &w, sizeof(w));
    return __half22float2(h);
  }
}

// x as packed pairs of Src codes (x: [2 * n], bits: [n]). The paired
// conversion gives 0x7FFF for every NaN, the code the contract fixes (the GPU
// tests feed NaN and infinite q and index q values through both kernels).
// fp16 sources keep a test for NaN over all of x and the fix-up per pair
// where one is there: without them ptxas spills the warps' kernel at its 72
// registers.
template <int Src, int N>
__device__ __forceinline__ void round_pairs(const float* x, std::uint32_t* bits) {
  if constexpr (Src == insert_detail::kSrcBf16) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * e], x[2 * e + 1]);
      memcpy(&bits[e], &h, sizeof(bits[e]));
    }
  } else {
    bool nan = false;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const __half2 h = __floats2half2_rn(x[2 * e], x[2 * e + 1]);
      memcpy(&bits[e], &h, sizeof(bits[e]));
      nan |= isnan(x[2 * e]) | isnan(x[2 * e + 1]);
    }
    if (__builtin_expect(nan, 0)) {
#pragma unroll
      for (int e = 0; e < N; ++e) bits[e] = insert_detail::half2_codes<kDstFp16>(x[2 * e], x[2 * e + 1]);
    }
  }
}

// 16 bytes at p, as four words: one vector access when Vec (the launch
// checked the alignment of every such address), two-byte ones otherwise.
template <bool Vec>
__device__ __forceinline__ uint4 load16(const void* p) {
  if constexpr (Vec) {
    return __ldg(static_cast<const uint4*>(p));
  } else {
    const std::uint16_t* h = static_cast<const std::uint16_t*>(p);
    std::uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = std::uint32_t(h[2 * e]) | (std::uint32_t(h[2 * e + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}
template <bool Vec>
__device__ __forceinline__ void store16(void* p, const std::uint32_t* w) {
  if constexpr (Vec) {
    *static_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    std::uint16_t* h = static_cast<std::uint16_t*>(p);
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = static_cast<std::uint16_t>(w[e >> 1] >> (16 * (e & 1)));
  }
}

// Elements i .. i+7 of an f32 / bf16 / fp16 table, as float.
//   table: [>= i + 8] of the tag's dtype (i a multiple of 8)
template <bool Vec>
__device__ __forceinline__ void load8_table(const void* table, int tag, std::int64_t i, float* out) {
  if (tag == kTableF32) {
    const float* p = static_cast<const float*>(table) + i;
    if constexpr (Vec) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p));
      const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = __ldg(p + e);
    }
  } else {
    const uint4 v = load16<Vec>(static_cast<const std::uint16_t*>(table) + i);
    const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = tag == kTableBf16 ? half2_to_float2<insert_detail::kSrcBf16>(w[e])
                                         : half2_to_float2<insert_detail::kSrcFp16>(w[e]);
      out[2 * e] = f.x;
      out[2 * e + 1] = f.y;
    }
  }
}

// An item's place and the small per-token values it needs (its qkv row part
// travels separately).
struct Item {
  bool valid = false;
  std::int64_t token = 0;
  std::int32_t head = 0;
  HeadKind kind = HeadKind::q;
  std::int64_t position = 0;
  std::int64_t slot = -1;  // K / V: the main slot; index key: the index slot
};

// The norm gains 1 + w of the four normed head kinds, in the order of HeadKind
// with V left out: q, k, index q, index k.
struct Gains {
  float g[4][kHeadDim];
};

__device__ __forceinline__ int gain_row(HeadKind kind) {
  return kind == HeadKind::q ? 0 : kind == HeadKind::k ? 1 : kind == HeadKind::index_q ? 2 : 3;
}

// Column d of every kind's gain (all loads issued before the first is used).
__device__ __forceinline__ void load_gains(const PreAttentionParams& p, int d, Gains& gains) {
  float v[4];
#pragma unroll
  for (int kind = 0; kind < 4; ++kind) {
    const void* w = kind == 0 ? p.q_weight : kind == 1 ? p.k_weight : kind == 2 ? p.index_q_weight : p.index_k_weight;
    const std::uint16_t* w16 = static_cast<const std::uint16_t*>(w);
    v[kind] = p.weight_tag == kTableF32    ? __ldg(static_cast<const float*>(w) + d)
              : p.weight_tag == kTableBf16 ? num::bf16_to_float(w16[d])
                                           : __half2float(__ushort_as_half(w16[d]));
  }
#pragma unroll
  for (int kind = 0; kind < 4; ++kind) gains.g[kind][d] = pre::norm_gain(v[kind]);
}

// Steps 1-3 of the SEMANTICS for this lane's 16 values: x (the qkv values)
// becomes u in the qkv dtype, packed in pairs in `bits`.
//   x: [16]   bits: [8]
// Every lane of the warp runs it (the warp's four groups hold one head kind),
// so its shuffles name the whole warp.
template <int Src, bool Vec>
__device__ __forceinline__ void norm_rope(const PreAttentionParams& p, const Gains& gains, HeadKind kind,
                                          std::int64_t position, int c, float* x, std::uint32_t* bits) {
  constexpr unsigned kWarp = 0xFFFFFFFFu;
  // The cos/sin row first: its loads overlap the norm.
  constexpr int half = kRopeDims / 2;
  float cs[8], sn[8];
  const std::int64_t row = position * kRopeDims + 8 * (c & 3);
  load8_table<Vec>(p.cos_sin, p.cos_sin_tag, row, cs);
  load8_table<Vec>(p.cos_sin, p.cos_sin_tag, row + half, sn);
  const float* gain = gains.g[gain_row(kind)];
  float s = pre::add(pre::sum_squares8(x), pre::sum_squares8(x + 8));  // p[c] + p[c + 8]
#pragma unroll
  for (int m = 4; m >= 1; m >>= 1) s = pre::add(s, __shfl_xor_sync(kWarp, s, m));
  const float r = pre::rms_factor(s, p.eps);
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    const float4 g0 = *reinterpret_cast<const float4*>(gain + 64 * g + 8 * c);
    const float4 g1 = *reinterpret_cast<const float4*>(gain + 64 * g + 8 * c + 4);
    const float w[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) x[8 * g + e] = pre::norm_scaled(x[8 * g + e], r, w[e]);
  }

  // RoPE on x[0..8) (dims 8c .. 8c+7 < 64): lanes 0-3 hold y[j] (j < 32),
  // lanes 4-7 the partners y[j + 32].
  float partner[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) partner[e] = __shfl_xor_sync(kWarp, x[e], 4);
  // rope_first(x, partner) = x*c - partner*sn is x*c + partner*(-sn) bit for
  // bit (rounding is symmetric), so both halves run rope_second's form.
  if (c < 4) {
#pragma unroll
    for (int e = 0; e < 8; ++e) sn[e] = -sn[e];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = pre::rope_second(partner[e], x[e], cs[e], sn[e]);
  round_pairs<Src, kValues / 2>(x, bits);
}

// u (packed in pairs) as float: x: [2 * n]   bits: [n]
template <int Src, int N>
__device__ __forceinline__ void unpack_pairs(const std::uint32_t* bits, float* x) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const float2 f = half2_to_float2<Src>(bits[e]);
    x[2 * e] = f.x;
    x[2 * e + 1] = f.y;
  }
}

// This lane's 16 values of a q or index q row (at element offset `off`): the
// qkv-dtype codes as they are, the other 16-bit dtype rounded from u, or e4m3
// of u / scale (scaled) or of u (the index q's plain cast).   bits: [8]
template <int Src, bool Vec>
__device__ __forceinline__ void store_output(void* base, int tag, std::int64_t off, const std::uint32_t* bits,
                                             bool scaled, float scale) {
  constexpr int kSame = Src == insert_detail::kSrcBf16 ? kDstBf16 : kDstFp16;
  constexpr int kOther = Src == insert_detail::kSrcBf16 ? kDstFp16 : kDstBf16;
  std::uint16_t* row = static_cast<std::uint16_t*>(base) + off;
  if (tag == kSame) {
    store16<Vec>(row, bits);
    store16<Vec>(row + 64, bits + 4);
    return;
  }
  float u[kValues];
  unpack_pairs<Src, kValues / 2>(bits, u);
  if (tag == kDstE4m3) {
    if (scaled) {
      const FloatDivisor divisor(scale);
      insert_detail::store8<kDstE4m3>(base, off, u, divisor);
      insert_detail::store8<kDstE4m3>(base, off + 64, u + 8, divisor);
    } else {
      insert_detail::store8<kDstE4m3>(base, off, u);
      insert_detail::store8<kDstE4m3>(base, off + 64, u + 8);
    }
  } else {
    std::uint32_t w[kValues / 2];
#pragma unroll
    for (int e = 0; e < kValues / 2; ++e) w[e] = insert_detail::half2_codes<kOther>(u[2 * e], u[2 * e + 1]);
    store16<Vec>(row, w);
    store16<Vec>(row + 64, w + 4);
  }
}

// Slot `slot` of a cache of `pages` pages: false (and recorded once, from
// `record`) when it is beyond the cache; negative slots are skips.
__device__ __forceinline__ bool slot_in_cache(std::int64_t slot, std::int64_t pages, std::int64_t* check,
                                              int kind, std::int64_t token, bool record) {
  if (slot < pages * kBlockSize) return true;
  if (record) detail::record_bad(check, kind, token, 0, 0, slot, pages);
  return false;
}

// Called by the whole warp: its four groups hold the same head of four tokens.
// A group whose token is past the last one, or whose position is outside the
// table, stores nothing.
template <int Src, int Dst, bool Vec>
__device__ __forceinline__ void process_item(const PreAttentionParams& p, const Gains& gains, const Item& it,
                                             const std::uint32_t* raw, int c, unsigned mask) {
  bool skip = !it.valid;
  if (it.valid && (it.position < 0 || it.position >= p.max_position)) {  // the token is skipped whole
    if (it.head == 0 && c == 0)
      detail::record_bad(p.check, detail::kBadPosition, it.token, 0, 0, it.position, p.max_position);
    skip = true;
  }
  float x[kValues];
  unpack_pairs<Src, kValues / 2>(raw, x);
  const bool lead = c == 0;
  if (it.kind == HeadKind::v) {
    if (skip || it.slot < 0) return;
    if (!slot_in_cache(it.slot, p.cache.num_pages, p.check, detail::kBadSlot, it.token, false)) return;
    const std::int64_t page = it.slot / kBlockSize;
    insert_detail::store_kv_row<Dst, kLanes>(p.cache, page, it.head - p.nq - p.nkv, it.slot - page * kBlockSize, 1,
                                             c, x, mask);
    return;
  }
  std::uint32_t bits[kValues / 2];
  norm_rope<Src, Vec>(p, gains, it.kind, skip ? 0 : it.position, c, x, bits);
  if (skip) return;
  if (it.kind == HeadKind::q || it.kind == HeadKind::index_q) {
    const bool q = it.kind == HeadKind::q;
    const std::int64_t off = q ? (it.token * p.nq + it.head) * kHeadDim
                               : (it.token * p.niq + (it.head - p.nq - 2 * p.nkv)) * kHeadDim;
    store_output<Src, Vec>(q ? p.q : p.index_q, q ? p.q_tag : p.index_q_tag, off + 8 * c, bits, q, p.q_scale);
    return;
  }
  if (it.slot < 0) return;
  unpack_pairs<Src, kValues / 2>(bits, x);
  if (it.kind == HeadKind::k) {
    const std::int32_t h = it.head - p.nq;
    if (!slot_in_cache(it.slot, p.cache.num_pages, p.check, detail::kBadSlot, it.token, lead && h == 0)) return;
    const std::int64_t page = it.slot / kBlockSize;
    insert_detail::store_kv_row<Dst, kLanes>(p.cache, page, h, it.slot - page * kBlockSize, 0, c, x, mask);
  } else {  // the index key
    if (!slot_in_cache(it.slot, p.index_cache.num_pages, p.check, detail::kBadIndexSlot, it.token, lead)) return;
    const std::int64_t page = it.slot / kBlockSize;
    insert_detail::store_index_row_tagged<kLanes>(p.index_tag, p.index_cache, page, it.slot - page * kBlockSize, c,
                                                  x, mask);
  }
}

}  // namespace msa::cuda::pre_detail
