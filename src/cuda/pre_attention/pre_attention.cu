// Pre-attention (msa/pre_attention.hpp, contract 10) in one pass over qkv,
// bit-identical to cpu::pre_attention.
//
// Work split: 8 lanes (a group) per (token, head) of the qkv rows. Lane c
// holds the elements 8c .. 8c+7 and 64+8c .. 64+8c+7 (two 16-byte loads), so
// that the rotated half of a head (dims 0..63) is spread over all 8 lanes and
// RoPE pairs element j (lanes 0-3) with j + 32 (lanes 4-7) by one shuffle.
// Items are numbered in tiles of kTileTokens tokens, head-major within a tile
// (in a spreading order of the heads, place_of), so the four groups of a warp
// take one head of four consecutive tokens: every branch on the head's kind
// is uniform over the warp (no kind's quantizer waits for another's, and the
// norm's shuffles name the whole warp).
//
// The grid is one wave of persistent blocks; each warp takes an equal
// contiguous run of the steps (four items each). While it processes step k,
// the qkv row parts of steps k + 1 .. k + kAhead are in flight into its
// staging slots in shared memory (cp.async, no registers held), and the small
// per-token values of step k + 1 in registers.
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
#include <algorithm>
#include <cstdint>
#include <numeric>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/check_pre_attention.hpp"
#include "core/pre_attention_math.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/device_check.cuh"
#include "cuda/common/float_divisor.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/insert/insert_store.cuh"
#include "cuda/insert/insert_util.cuh"
#include "cuda/pre_attention/fast_divide.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cuda {
namespace {

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
constexpr int kThreads = 128;
constexpr int kTileTokens = 32 / kLanes;    // tokens of a tile: a warp's groups
constexpr int kAhead = 2;                   // steps whose qkv rows are in flight
constexpr int kSlots = kAhead + 1;          // staging slots per warp
// 7 blocks of 4 warps per SM: ptxas keeps every instance within 73 registers
// without spilling (at 8 blocks, 64 registers, it spills).
constexpr int kMinBlocks = 7;

struct PreAttentionParams {
  KVCacheView cache;
  IndexCacheView index_cache;
  int index_tag = kDstBf16;               // insert_detail::index_dst_tag
  const std::uint16_t* qkv = nullptr;     // [num_tokens, row_stride] bf16/fp16 bits
  std::int64_t row_stride = 0;            // elements
  std::int64_t num_tokens = 0;
  std::uint32_t heads = 0;                // per token: nq + 2 * nkv + niq + 1
  FastDivisor by_tile;                    // item -> tile: heads * kTileTokens items each
  FastDivisor by_heads;
  std::uint32_t head_step = 1;            // the tile's j-th head is (j * head_step) % heads
  std::uint32_t items = 0;                // tiles * heads * kTileTokens (< 2^31)
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

int table_tag(DType t) {
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

// x as packed pairs of Src codes (x: [2 * n], bits: [n]). One test for NaN
// over all of x: the fix-up per pair runs only when one is there.
template <int Src, int N>
__device__ __forceinline__ void round_pairs(const float* x, std::uint32_t* bits) {
  constexpr int kDst = Src == insert_detail::kSrcBf16 ? kDstBf16 : kDstFp16;
  bool nan = false;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    if constexpr (kDst == kDstBf16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * e], x[2 * e + 1]);
      memcpy(&bits[e], &h, sizeof(bits[e]));
    } else {
      const __half2 h = __floats2half2_rn(x[2 * e], x[2 * e + 1]);
      memcpy(&bits[e], &h, sizeof(bits[e]));
    }
    nan |= isnan(x[2 * e]) | isnan(x[2 * e + 1]);
  }
  if (__builtin_expect(nan, 0)) {
#pragma unroll
    for (int e = 0; e < N; ++e) bits[e] = insert_detail::half2_codes<kDst>(x[2 * e], x[2 * e + 1]);
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
// travels separately, through the warp's staging slots).
struct Item {
  bool valid = false;
  std::int64_t token = 0;
  std::int32_t head = 0;
  HeadKind kind = HeadKind::q;
  std::int64_t position = 0;
  std::int64_t slot = -1;  // K / V: the main slot; index key: the index slot
};

// A warp's staging slot: the 16 values of each lane for one step, as they are
// in qkv, part g (elements 64g + 8c ..) of lane l at [g][l] (conflict-free reads).
struct RowSlot {
  uint4 part[2][32];
};

// Item `item`'s token and head: tile item / (heads * kTileTokens), head-major
// within the tile, its j-th head (j * head_step) % heads. head_step (coprime
// to heads, near 0.618 heads) spreads the K / V heads, whose stores cost the
// most, evenly over the tile's order, so that any run of a warp holds its
// share of them.
struct Place {
  std::int64_t token;
  std::int32_t head;
};
__device__ __forceinline__ Place place_of(const PreAttentionParams& p, std::uint32_t item) {
  const std::uint32_t tile = p.by_tile.divide(item);
  const std::uint32_t within = item - tile * p.heads * kTileTokens;
  const std::uint32_t j = within / kTileTokens * p.head_step;
  return {std::int64_t(tile) * kTileTokens + within % kTileTokens,
          static_cast<std::int32_t>(j - p.by_heads.divide(j) * p.heads)};
}

// Elements 8c .. 8c+7 (part 0) and 64+8c .. 64+8c+7 (part 1) of a head.
__device__ __forceinline__ const std::uint16_t* row_part(const PreAttentionParams& p, const Place& at, int c) {
  return p.qkv + at.token * p.row_stride + std::int64_t(at.head) * kHeadDim + 8 * c;
}

// Starts the copy of this lane's two parts of item `item`'s qkv row into
// `slot` (zeros for an item past the last token), as one cp.async group.
__device__ __forceinline__ void fetch_row(const PreAttentionParams& p, std::uint32_t item, int lane, int c,
                                          RowSlot& slot) {
  const Place at = place_of(p, item);
  const bool valid = item < p.items && at.token < p.num_tokens;
  const std::uint16_t* src = valid ? row_part(p, at, c) : p.qkv;
#pragma unroll
  for (int g = 0; g < 2; ++g) cp_async16_zfill(smem_u32(&slot.part[g][lane]), src + 64 * g, valid ? 16 : 0);
  cp_async_commit();
}

// This lane's 16 qkv values of `it` as packed pairs: from the staging slot
// (Vec), or loaded here.   raw: [8]
template <bool Vec>
__device__ __forceinline__ void read_row(const PreAttentionParams& p, const Item& it, int lane, int c,
                                         const RowSlot& slot, std::uint32_t* raw) {
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if constexpr (Vec) v = slot.part[g][lane];
    else if (it.valid) v = load16<false>(row_part(p, Place{it.token, it.head}, c) + 64 * g);
    raw[4 * g] = v.x, raw[4 * g + 1] = v.y, raw[4 * g + 2] = v.z, raw[4 * g + 3] = v.w;
  }
}

__device__ __forceinline__ void load_item(const PreAttentionParams& p, std::uint32_t item, Item& it) {
  const Place at = place_of(p, item);
  it.token = at.token;
  it.head = at.head;
  it.kind = pre::head_kind(it.head, p.nq, p.nkv, p.niq);
  it.valid = item < p.items && it.token < p.num_tokens;
  it.position = 0;
  it.slot = -1;
  if (!it.valid) return;  // a token past the last one: its group runs the norm on zeros
  it.position = __ldg(p.positions + it.token);
  if (it.kind == HeadKind::k || it.kind == HeadKind::v) it.slot = __ldg(p.slots + it.token);
  else if (it.kind == HeadKind::index_k) it.slot = __ldg(p.index_slots + it.token);
}

// The norm gains 1 + w of the four normed head kinds, in the order of HeadKind
// with V left out: q, k, index q, index k.
struct Gains {
  float g[4][kHeadDim];
};

__device__ __forceinline__ int gain_row(HeadKind kind) {
  return kind == HeadKind::q ? 0 : kind == HeadKind::k ? 1 : kind == HeadKind::index_q ? 2 : 3;
}

// Thread i takes element i % 128 of every kind's weight (all loads issued
// before the first is used).
__device__ void load_gains(const PreAttentionParams& p, Gains& gains) {
  static_assert(kHeadDim % kThreads == 0, "a thread's elements are whole columns");
  constexpr int kPer = kHeadDim / kThreads;
  float v[4][kPer];
#pragma unroll
  for (int kind = 0; kind < 4; ++kind) {
    const void* w = kind == 0 ? p.q_weight : kind == 1 ? p.k_weight : kind == 2 ? p.index_q_weight : p.index_k_weight;
    const std::uint16_t* w16 = static_cast<const std::uint16_t*>(w);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int d = threadIdx.x + e * kThreads;
      v[kind][e] = p.weight_tag == kTableF32    ? __ldg(static_cast<const float*>(w) + d)
                   : p.weight_tag == kTableBf16 ? num::bf16_to_float(w16[d])
                                                : __half2float(__ushort_as_half(w16[d]));
    }
  }
#pragma unroll
  for (int kind = 0; kind < 4; ++kind)
#pragma unroll
    for (int e = 0; e < kPer; ++e) gains.g[kind][threadIdx.x + e * kThreads] = pre::norm_gain(v[kind][e]);
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

// A persistent grid. The step's items come in fours (one per group of a
// warp: one head of a tile's four tokens), and warp w of W takes the w-th of W
// equal contiguous runs of them: a warp walks the heads of its tiles in
// place_of's order (every kind in turn, so no warp is left with the costly
// ones, and the tiles' cos/sin rows stay in L1). Vec: every qkv row part, q / index q store and
// cos/sin row is 16-byte aligned (checked at launch): the row parts of step
// k + kAhead are copied into the warp's staging slots (cp.async) while it
// processes step k, and the other accesses are single vector ones. Otherwise
// the rows are loaded when processed.
template <int Src, int Dst, bool Vec>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pre_attention_kernel(const PreAttentionParams p) {
  __shared__ __align__(16) Gains gains;
  __shared__ RowSlot slots[kThreads / 32][kSlots];
  const int lane = threadIdx.x & 31;
  const int c = lane & (kLanes - 1);
  const unsigned mask = ((1u << kLanes) - 1) << (lane & ~(kLanes - 1));  // this group's lanes
  constexpr std::uint32_t kWarps = kThreads / 32;
  RowSlot* ring = slots[threadIdx.x / 32];
  const std::uint64_t warps = std::uint64_t(gridDim.x) * kWarps, w = blockIdx.x * kWarps + threadIdx.x / 32;
  const std::uint64_t fours = p.items / kTileTokens;
  const std::uint32_t begin = std::uint32_t(fours * w / warps), end = std::uint32_t(fours * (w + 1) / warps);
  const std::uint32_t group = lane / kLanes;
  // The item of this group at step s of the warp's run (past the run: past every item).
  const auto item_at = [&](std::uint32_t s) { return s < end ? s * kTileTokens + group : p.items; };
  if constexpr (Vec) {
#pragma unroll
    for (int k = 0; k < kAhead; ++k) fetch_row(p, item_at(begin + k), lane, c, ring[k]);
  }
  Item cur, next;
  load_item(p, item_at(begin), cur);
  load_item(p, item_at(begin + 1), next);
  load_gains(p, gains);
  __syncthreads();
  for (std::uint32_t s = begin, k = 0; s < end; ++s, ++k) {
    std::uint32_t raw[kValues / 2];
    if constexpr (Vec) {
      // Each lane reads back only the parts it copied itself: its own
      // cp.async groups order the slot's reuse, no warp barrier.
      fetch_row(p, item_at(s + kAhead), lane, c, ring[(k + kAhead) % kSlots]);
      cp_async_wait<kAhead>();
    }
    read_row<Vec>(p, cur, lane, c, ring[k % kSlots], raw);
    process_item<Src, Dst, Vec>(p, gains, cur, raw, c, mask);
    cur = next;
    load_item(p, item_at(s + 2), next);
  }
}

// The step coprime to `heads` nearest 0.618 heads (a golden-ratio stride
// visits any range of heads at near-equal gaps).
std::uint32_t spreading_step(std::uint32_t heads) {
  const auto coprime = [heads](std::uint32_t a) { return std::gcd(a, heads) == 1; };
  const std::uint32_t aim = static_cast<std::uint32_t>(0.618 * heads + 0.5);
  for (std::uint32_t d = 0; d < heads; ++d) {
    if (aim + d < heads && coprime(aim + d)) return aim + d;
    if (aim >= d && aim - d > 0 && coprime(aim - d)) return aim - d;
  }
  return 1;
}

// Blocks of pre_attention_kernel<Src, Dst, Vec> resident on one SM (asked once).
template <int Src, int Dst, bool Vec>
int resident_blocks() {
  static const int blocks = [] {
    int n = 0;
    MSA_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, pre_attention_kernel<Src, Dst, Vec>, kThreads, 0));
    return std::max(n, 1);
  }();
  return blocks;
}

// One wave of resident blocks, fewer when there are fewer items.
template <int Src, int Dst, bool Vec>
void launch_persistent(const PreAttentionParams& p, cudaStream_t stream) {
  constexpr int kItemsPerStep = kThreads / kLanes;
  const std::int64_t needed = (std::int64_t(p.items) + kItemsPerStep - 1) / kItemsPerStep;
  const std::int64_t wave = std::int64_t(resident_blocks<Src, Dst, Vec>()) * device_sm_count();
  const std::int64_t blocks = std::min(needed, wave);
  pre_attention_kernel<Src, Dst, Vec><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
}

template <int Src>
void launch(const PreAttentionParams& p, int dst, bool vec, cudaStream_t stream) {
  insert_detail::with_dst_tag(dst, [&](auto tag) {
    constexpr int kDst = decltype(tag)::value;
    if (vec) launch_persistent<Src, kDst, true>(p, stream);
    else launch_persistent<Src, kDst, false>(p, stream);
  });
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void pre_attention(const KVCacheView& cache, const IndexCacheView& index_cache, const PreAttentionArgs& a,
                   Stream stream, const DeviceCheck& check) {
  check::pre_attention_shape(cache, index_cache, a);
  const int dst = insert_detail::dst_tag(cache.dtype, "pre_attention: cache.dtype");
  const int index_tag = insert_detail::index_dst_tag(index_cache.dtype, "pre_attention: index_cache.dtype");
  if (a.num_tokens == 0) return;
  const std::int64_t tiles = (a.num_tokens + kTileTokens - 1) / kTileTokens;
  const std::int64_t items = tiles * kTileTokens * a.heads_per_token();
  MSA_CHECK(items < (std::int64_t(1) << 31), "pre_attention: num_tokens = ", a.num_tokens, " (rounded up to ",
            tiles * kTileTokens, ") times ", a.heads_per_token(),
            " heads is too large for one launch (at most 2^31 - 1 heads)");

  PreAttentionParams p;
  p.cache = cache;
  p.index_cache = index_cache;
  p.index_tag = index_tag;
  p.qkv = static_cast<const std::uint16_t*>(a.qkv);
  p.row_stride = a.row_stride();
  p.num_tokens = a.num_tokens;
  p.heads = static_cast<std::uint32_t>(a.heads_per_token());
  p.by_tile = FastDivisor(p.heads * kTileTokens);
  p.by_heads = FastDivisor(p.heads);
  p.head_step = spreading_step(p.heads);
  p.items = static_cast<std::uint32_t>(items);
  p.nq = a.num_q_heads;
  p.nkv = a.num_kv_heads;
  p.niq = a.num_index_heads;
  p.positions = a.positions;
  p.q_weight = a.q_weight;
  p.k_weight = a.k_weight;
  p.index_q_weight = a.index_q_weight;
  p.index_k_weight = a.index_k_weight;
  p.weight_tag = table_tag(a.weight_dtype);
  p.eps = a.eps;
  p.cos_sin = a.cos_sin;
  p.cos_sin_tag = table_tag(a.cos_sin_dtype);
  p.max_position = a.max_position;
  p.q = a.q;
  p.q_tag = insert_detail::dst_tag(a.q_dtype, "pre_attention: q_dtype");
  p.q_scale = a.q_scale;
  p.index_q = a.index_q;
  p.index_q_tag = insert_detail::dst_tag(a.index_q_dtype, "pre_attention: index_q_dtype");
  p.slots = a.slots;
  p.index_slots = a.index_slots != nullptr ? a.index_slots : a.slots;
  p.check = check.buffer;
  // The vector instance: qkv rows, the q / index q rows (16-bit outputs) and
  // the cos/sin rows all start on 16 bytes.
  const auto on16 = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  const bool vec = on16(p.qkv) && p.row_stride % 8 == 0 && on16(p.q) && on16(p.index_q) && on16(p.cos_sin);
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.qkv_dtype == DType::bf16) launch<insert_detail::kSrcBf16>(p, dst, vec, s);
  else launch<insert_detail::kSrcFp16>(p, dst, vec, s);
}

}  // namespace msa::cuda
