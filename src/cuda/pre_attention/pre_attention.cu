// Pre-attention (msa/pre_attention.hpp, contract 10) in one pass over qkv,
// bit-identical to cpu::pre_attention.
//
// Work split: 16 lanes (half a warp) per (token, head) of the qkv rows, lane c
// holding elements 8c .. 8c+7 (one 16-byte load). Items are numbered token-
// major, head-minor, and the two halves of a warp take neighbouring items, so
// each load instruction of a warp reads 512 consecutive bytes.
//
// Schedule (the kernel is bound by memory, so it keeps loads in flight): a
// grid of at most one wave of resident blocks walks the items in passes, each
// half taking kItems items per pass. The half's kItems fetch slots form a
// ring: right after a slot's item is processed, the slot issues the loads of
// the item it takes in the next pass (qkv chunk, position), so while a half
// computes one item the qkv reads of kItems - 1 others are in flight. An
// item's remaining loads (slot, cos/sin row) need only its position, which
// arrived a pass early, and are issued before its arithmetic; the norm gains
// 1 + w of the four normed head kinds are staged once per block in shared
// memory. No load waits for another load of the same pass: an item's
// arithmetic waits at most for one more round trip (slot, cos/sin row, mostly
// served by the caches).
//
// Per item, in the order of the SEMANTICS: the sum of squares is each lane's 8
// squares then an xor tree over the 16 lanes (the tree src/core/
// pre_attention_math.hpp spells out for the CPU); RoPE pairs element j (lanes
// 0-3, which load the cos of its column) with j + 32 (lanes 4-7, which load
// the sin), the two lanes swapping values and table entries by shuffles; the
// result is rounded to the qkv dtype, and the stores are insert_store.cuh's,
// the very code of insert_kv / insert_index, so every cache dtype the inserts
// know is written here the same way. All shuffles name the half's 16 lanes
// only: the two halves of a warp may hold different kinds of heads.
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/check_pre_attention.hpp"
#include "core/pre_attention_math.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/device_check.cuh"
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
using insert_detail::kDstE5m2;
using insert_detail::kDstFp16;
using insert_detail::kDstNvfp4;
using pre::HeadKind;

// Tags of the small tables' dtypes (norm weights, cos/sin).
constexpr int kTableF32 = 0;
constexpr int kTableBf16 = 1;
constexpr int kTableFp16 = 2;

constexpr int kThreads = 256;
constexpr int kHalves = kThreads / 16;  // halves of a block, one item each at a time
constexpr int kItems = 3;               // items per half and pass (fetch slots)
// Blocks per SM that __launch_bounds__ asks ptxas to fit (at most 64
// registers a thread): 1024 threads of an SM with (kItems - 1) x 16 bytes of
// qkv each in flight, 32 KB. A fourth slot needs more registers than that.
constexpr int kMinBlocks = 4;
constexpr int kNormedKinds = 4;  // q, k, index q, index key
static_assert(kItems <= 16, "lane k of a half holds the position of fetch slot k");

struct PreAttentionParams {
  KVCacheView cache;
  IndexCacheView index_cache;
  int index_tag = kDstBf16;               // insert_detail::index_dst_tag
  const std::uint16_t* qkv = nullptr;     // [num_tokens, row_stride] bf16/fp16 bits
  std::int64_t row_stride = 0;            // elements
  std::int64_t num_tokens = 0;
  std::uint32_t heads = 0;                // per token: nq + 2 * nkv + niq + 1
  FastDivisor by_heads;                   // item -> token
  std::uint32_t items = 0;                // num_tokens * heads (< 2^31)
  std::int32_t nq = 0, nkv = 0, niq = 0;
  const std::int64_t* positions = nullptr;  // [num_tokens]
  const void* weights[kNormedKinds] = {};   // [128] each, weight_tag: q, k, index q, index key
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
// with the hardware's paired conversion, and NaN becomes 0x7FFF as in
// msa/numeric.hpp (NaN payloads elsewhere never reach an output: every encoder
// of msa/numeric.hpp maps any NaN to one code).
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

template <int Src>
__device__ __forceinline__ std::uint32_t float2_to_half2(float a, float b) {
  std::uint32_t w;
  if constexpr (Src == insert_detail::kSrcBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    memcpy(&w, &h, sizeof(w));
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    memcpy(&w, &h, sizeof(w));
  }
  if (__builtin_expect(a != a || b != b, 0)) {
    if (a != a) w = (w & 0xFFFF0000u) | 0x7FFFu;
    if (b != b) w = (w & 0x0000FFFFu) | 0x7FFF0000u;
  }
  return w;
}

// 8 bf16 / fp16 values as they are in memory, packed in pairs (16 bytes at
// once when aligned). qkv is read once: the loads are marked streaming so that
// they do not push the tables out of the caches.
//   src: [8] 16-bit elements
__device__ __forceinline__ uint4 load8_bits(const std::uint16_t* src) {
  if (insert_detail::aligned(src, 16)) return __ldcs(reinterpret_cast<const uint4*>(src));
  std::uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) w[e] = std::uint32_t(src[2 * e]) | (std::uint32_t(src[2 * e + 1]) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// x[e] = the e-th of the 8 packed values, as float.
template <int Src>
__device__ __forceinline__ void unpack8(const uint4& v, float* x) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = half2_to_float2<Src>(w[e]);
    x[2 * e] = f.x;
    x[2 * e + 1] = f.y;
  }
}

// Element i of an f32 / bf16 / fp16 table, as float.
__device__ __forceinline__ float table_value(const void* table, int tag, int i) {
  if (tag == kTableF32) return __ldg(static_cast<const float*>(table) + i);
  const std::uint16_t h = __ldg(static_cast<const unsigned short*>(table) + i);
  return tag == kTableBf16 ? num::bf16_to_float(h) : num::fp16_to_float(h);
}

// Elements i .. i+7 of an f32 / bf16 / fp16 table, as float.
//   table: [>= i + 8] of the tag's dtype
__device__ __forceinline__ void load8_table(const void* table, int tag, std::int64_t i, float* out) {
  if (tag == kTableF32) {
    const float* p = static_cast<const float*>(table) + i;
    if (insert_detail::aligned(p, 16)) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(p));
      const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
      out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
      out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = __ldg(p + e);
    }
  } else {
    const auto* p = static_cast<const unsigned short*>(table) + i;
    uint4 v;
    if (insert_detail::aligned(p, 16)) {
      v = __ldg(reinterpret_cast<const uint4*>(p));
    } else {
      std::uint32_t w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) w[e] = std::uint32_t(__ldg(p + 2 * e)) | (std::uint32_t(__ldg(p + 2 * e + 1)) << 16);
      v = make_uint4(w[0], w[1], w[2], w[3]);
    }
    if (tag == kTableBf16) unpack8<insert_detail::kSrcBf16>(v, out);
    else unpack8<insert_detail::kSrcFp16>(v, out);
  }
}

// 8 bf16 / fp16 values (packed in pairs) at element offset `off`.
//   base: 16-bit elements
__device__ __forceinline__ void store8_bits(void* base, std::int64_t off, const std::uint32_t* w) {
  std::uint16_t* dst = static_cast<std::uint16_t*>(base) + off;
  if (insert_detail::aligned(dst, 16)) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[e] = static_cast<std::uint16_t>(w[e >> 1] >> (16 * (e & 1)));
  }
}

// 8 values u of an output row (q or index q) at element offset `off`: the
// qkv-dtype bits as they are, the other 16-bit dtype rounded from u, or e4m3
// of u / scale.
//   u: [8] values of the qkv dtype   bits: [4] the same values packed in pairs
template <int Src>
__device__ __forceinline__ void store8_output(void* base, int tag, std::int64_t off, const float* u,
                                              const std::uint32_t* bits, float scale) {
  constexpr int kSame = Src == insert_detail::kSrcBf16 ? kDstBf16 : kDstFp16;
  constexpr int kOther = Src == insert_detail::kSrcBf16 ? insert_detail::kSrcFp16 : insert_detail::kSrcBf16;
  if (tag == kSame) {
    store8_bits(base, off, bits);
  } else if (tag == kDstE4m3) {
    insert_detail::store8<kDstE4m3>(base, off, u, scale);
  } else {
    std::uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = float2_to_half2<kOther>(u[2 * e], u[2 * e + 1]);
    store8_bits(base, off, w);
  }
}

// ---- the norm gains in shared memory ------------------------------------------------
// gains[k][d] = 1 + w_k[d] for the normed kinds k = q, k, index q, index key.
//   gains: [4, 128] shared
__device__ __forceinline__ void stage_gains(const PreAttentionParams& p, float* gains) {
  for (int i = threadIdx.x; i < kNormedKinds * kHeadDim; i += kThreads)
    gains[i] = pre::gain(table_value(p.weights[i / kHeadDim], p.weight_tag, i % kHeadDim));
}

// The row of `gains` of a normed head kind.
__device__ __forceinline__ int gain_row(HeadKind kind) {
  return kind == HeadKind::q ? 0 : kind == HeadKind::k ? 1 : kind == HeadKind::index_q ? 2 : 3;
}

// ---- one item -----------------------------------------------------------------------
struct ItemPlace {
  std::uint32_t token;
  std::int32_t head;
};

__device__ __forceinline__ ItemPlace place(const PreAttentionParams& p, std::uint32_t item) {
  const std::uint32_t token = p.by_heads.divide(item);
  return {token, static_cast<std::int32_t>(item - token * p.heads)};
}

// Issues the loads of `item` (nothing when it is past the end) for fetch slot
// k: this lane's qkv chunk, and the token's position into lane k of the half
// (the half's lanes hold one position each, which keeps registers for more
// chunks in flight).
//   chunk: this lane's 8 qkv values, packed   position: the lane's slot's position
__device__ __forceinline__ void fetch(const PreAttentionParams& p, std::uint32_t item, int c, int k, uint4& chunk,
                                      std::int64_t& position) {
  if (item >= p.items) return;
  const ItemPlace at = place(p, item);
  chunk = load8_bits(p.qkv + std::int64_t(at.token) * p.row_stride + std::int64_t(at.head) * kHeadDim + 8 * c);
  if (c == k) position = __ldg(p.positions + at.token);
}

// Steps 1-3 of the SEMANTICS for this lane's 8 values: x becomes u, and
// `bits` holds u in the qkv dtype, packed in pairs.
//   x: [8]   g: [8] this lane's gains   t: [8] lanes 0-3: cos, lanes 4-7: sin
//   of the lane's RoPE columns 8 (c & 3) .. 8 (c & 3) + 7   bits: [4]
template <int Src>
__device__ __forceinline__ void norm_rope(float eps, int c, unsigned mask, const float* g, const float* t, float* x,
                                          std::uint32_t* bits) {
  float s = pre::sum_squares8(x);
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) s = pre::add(s, __shfl_xor_sync(mask, s, m));
  const float r = pre::rms_factor(s, eps);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = pre::norm_gained(x[e], r, g[e]);

  // RoPE: lanes 0-3 hold y[j] (j < 32) and cos, lanes 4-7 y[j + 32] and sin;
  // lane pairs (c, c + 4) swap both by shuffles. Every lane of the half takes
  // part, lanes 8-15 (dims 64..127) keep their values. Lanes 4-7 run
  // rope_first with the sine negated, which is rope_second.
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float partner = __shfl_xor_sync(mask, x[e], 4);
    const float other = __shfl_xor_sync(mask, t[e], 4);
    if (c < 4) x[e] = pre::rope_first(x[e], partner, t[e], other);
    else if (c < 8) x[e] = pre::rope_first(x[e], partner, other, -t[e]);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    bits[e] = float2_to_half2<Src>(x[2 * e], x[2 * e + 1]);
    const float2 u = half2_to_float2<Src>(bits[e]);
    x[2 * e] = u.x;
    x[2 * e + 1] = u.y;
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

template <int Src, int Dst>
__device__ __forceinline__ void process_item(const PreAttentionParams& p, const float* gains, std::uint32_t item,
                                             const uint4& chunk, std::int64_t position, int c,
                                             unsigned mask) {
  const ItemPlace at = place(p, item);
  const std::int64_t token = at.token;
  const HeadKind kind = pre::head_kind(at.head, p.nq, p.nkv, p.niq);
  if (position < 0 || position >= p.max_position) {  // the token is skipped whole
    if (at.head == 0 && c == 0)
      detail::record_bad(p.check, detail::kBadPosition, token, 0, 0, position, p.max_position);
    return;
  }
  // Every load before any arithmetic: the slot, the cos/sin row, the gains.
  std::int64_t slot = -1;
  if (kind == HeadKind::k || kind == HeadKind::v) slot = __ldg(p.slots + token);
  else if (kind == HeadKind::index_k) slot = __ldg(p.index_slots + token);
  float x[8];
  unpack8<Src>(chunk, x);
  const bool lead = c == 0;
  if (kind == HeadKind::v) {
    if (slot < 0) return;
    if (!slot_in_cache(slot, p.cache.num_pages, p.check, detail::kBadSlot, token, false)) return;
    const std::int64_t page = slot / kBlockSize;
    insert_detail::store_kv8<Dst>(p.cache, page, at.head - p.nq - p.nkv, slot - page * kBlockSize, 1, c, x, mask);
    return;
  }
  float t[8] = {};  // lanes 0-7: the row's elements 8c .. 8c+7 (cos for c < 4, sin for 4 <= c < 8)
  if (c < 8) load8_table(p.cos_sin, p.cos_sin_tag, position * kRopeDims + 8 * c, t);
  float g[8];
  const float4* gain4 = reinterpret_cast<const float4*>(gains + gain_row(kind) * kHeadDim + 8 * c);
  const float4 g0 = gain4[0], g1 = gain4[1];
  g[0] = g0.x, g[1] = g0.y, g[2] = g0.z, g[3] = g0.w, g[4] = g1.x, g[5] = g1.y, g[6] = g1.z, g[7] = g1.w;

  std::uint32_t bits[4];
  norm_rope<Src>(p.eps, c, mask, g, t, x, bits);
  switch (kind) {
    case HeadKind::q:
      store8_output<Src>(p.q, p.q_tag, (token * p.nq + at.head) * kHeadDim + 8 * c, x, bits, p.q_scale);
      break;
    case HeadKind::index_q:
      store8_output<Src>(p.index_q, p.index_q_tag, (token * p.niq + (at.head - p.nq - 2 * p.nkv)) * kHeadDim + 8 * c,
                         x, bits, 1.0f);
      break;
    case HeadKind::k: {
      if (slot < 0) break;
      const std::int32_t h = at.head - p.nq;
      if (!slot_in_cache(slot, p.cache.num_pages, p.check, detail::kBadSlot, token, lead && h == 0)) break;
      const std::int64_t page = slot / kBlockSize;
      insert_detail::store_kv8<Dst>(p.cache, page, h, slot - page * kBlockSize, 0, c, x, mask);
      break;
    }
    default: {  // the index key
      if (slot < 0) break;
      if (!slot_in_cache(slot, p.index_cache.num_pages, p.check, detail::kBadIndexSlot, token, lead)) break;
      const std::int64_t page = slot / kBlockSize;
      insert_detail::store_index8_tagged(p.index_tag, p.index_cache, page, slot - page * kBlockSize, c, x, mask);
      break;
    }
  }
}

// ---- the kernel ---------------------------------------------------------------------
// Half h of the grid (of `halves`) takes, in pass r, the items
// r * kItems * halves + k * halves + h for k < kItems. Its kItems fetch slots
// form a ring: right after slot k's item is processed, the slot fetches the
// item it takes in the next pass, so kItems - 1 items of every half are in
// flight while it computes.
template <int Src, int Dst>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pre_attention_kernel(const PreAttentionParams p) {
  __shared__ __align__(16) float gains[kNormedKinds * kHeadDim];
  const int lane = threadIdx.x & 31;
  const int c = lane & 15;
  const unsigned mask = 0xFFFFu << (lane & 16);  // this half's lanes
  const std::uint32_t halves = gridDim.x * kHalves;
  const std::uint32_t pass = halves * kItems;  // items of one pass of the grid

  std::uint32_t first = blockIdx.x * kHalves + (threadIdx.x >> 4);
  uint4 chunk[kItems];
  std::int64_t position = 0;  // lane k < kItems: slot k's
#pragma unroll
  for (int k = 0; k < kItems; ++k) fetch(p, first + k * halves, c, k, chunk[k], position);
  stage_gains(p, gains);  // while the first loads are in flight
  __syncthreads();

  // items < 2^31 and a pass is at most a wave of halves times kItems: item +
  // pass never wraps.
  for (; first < p.items; first += pass) {
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const std::uint32_t item = first + k * halves;
      if (item >= p.items) break;
      const std::int64_t at = __shfl_sync(mask, position, k, 16);
      process_item<Src, Dst>(p, gains, item, chunk[k], at, c, mask);
      fetch(p, item + pass, c, k, chunk[k], position);
    }
  }
}

template <int Src, int Dst>
void launch(const PreAttentionParams& p, cudaStream_t stream) {
  // One item per half while they fit in one wave of resident blocks (the
  // shortest path for few tokens), else one wave that walks the rest in passes.
  // __launch_bounds__ fits kMinBlocks blocks on an SM, and the kernel takes
  // all the registers that leaves it, so no more fit.
  const std::int64_t spread = (std::int64_t(p.items) + kHalves - 1) / kHalves;
  const std::int64_t wave = std::int64_t(kMinBlocks) * std::max(device_sm_count(), 1);
  const unsigned grid = static_cast<unsigned>(std::min(spread, wave));
  pre_attention_kernel<Src, Dst><<<grid, kThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

template <int Src>
void launch(const PreAttentionParams& p, int dst, cudaStream_t stream) {
  switch (dst) {
    case kDstBf16: launch<Src, kDstBf16>(p, stream); break;
    case kDstFp16: launch<Src, kDstFp16>(p, stream); break;
    case kDstE4m3: launch<Src, kDstE4m3>(p, stream); break;
    case kDstE5m2: launch<Src, kDstE5m2>(p, stream); break;
    default: launch<Src, kDstNvfp4>(p, stream); break;
  }
}

}  // namespace

void pre_attention(const KVCacheView& cache, const IndexCacheView& index_cache, const PreAttentionArgs& a,
                   Stream stream, const DeviceCheck& check) {
  check::pre_attention_shape(cache, index_cache, a);
  const int dst = insert_detail::dst_tag(cache.dtype, "pre_attention: cache.dtype");
  const int index_tag = insert_detail::index_dst_tag(index_cache.dtype, "pre_attention: index_cache.dtype");
  if (a.num_tokens == 0) return;
  const std::int64_t items = a.num_tokens * a.heads_per_token();
  MSA_CHECK(items < (std::int64_t(1) << 31), "pre_attention: num_tokens = ", a.num_tokens, " times ",
            a.heads_per_token(), " heads is too large for one launch (at most 2^31 - 1 heads)");

  PreAttentionParams p;
  p.cache = cache;
  p.index_cache = index_cache;
  p.index_tag = index_tag;
  p.qkv = static_cast<const std::uint16_t*>(a.qkv);
  p.row_stride = a.row_stride();
  p.num_tokens = a.num_tokens;
  p.heads = static_cast<std::uint32_t>(a.heads_per_token());
  p.by_heads = FastDivisor(p.heads);
  p.items = static_cast<std::uint32_t>(items);
  p.nq = a.num_q_heads;
  p.nkv = a.num_kv_heads;
  p.niq = a.num_index_heads;
  p.positions = a.positions;
  p.weights[0] = a.q_weight;
  p.weights[1] = a.k_weight;
  p.weights[2] = a.index_q_weight;
  p.weights[3] = a.index_k_weight;
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
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.qkv_dtype == DType::bf16) launch<insert_detail::kSrcBf16>(p, dst, s);
  else launch<insert_detail::kSrcFp16>(p, dst, s);
}

}  // namespace msa::cuda
