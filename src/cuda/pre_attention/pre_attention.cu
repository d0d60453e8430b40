// Pre-attention (msa/pre_attention.hpp, contract 10) in one pass over qkv,
// bit-identical to cpu::pre_attention.
//
// Work split: 16 lanes (half a warp) per (token, head) of the qkv rows, lane c
// holding elements 8c .. 8c+7 (one 16-byte load). Items are numbered token-
// major, head-minor, so a warp's two halves read 512 consecutive bytes; each
// half takes kItems items kHalves apart and issues all their loads before it
// computes, to keep more bytes in flight per thread.
//
// Per item, in the order of the SEMANTICS: the sum of squares is each lane's 8
// squares then an xor tree over the 16 lanes (the tree src/core/
// pre_attention_math.hpp spells out for the CPU), RoPE pairs element j (lanes
// 0-3) with j + 32 (lanes 4-7) by one shuffle, the result is rounded to the
// qkv dtype, and the stores are insert_store.cuh's, the very code of
// insert_kv / insert_index, so every cache dtype the inserts know is written
// here the same way. All shuffles name the half's 16 lanes only: the two
// halves of a warp may hold different kinds of heads.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/check_pre_attention.hpp"
#include "core/pre_attention_math.hpp"
#include "cuda/common/check.cuh"
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
using insert_detail::kDstFp16;
using pre::HeadKind;

// Tags of the small tables' dtypes (norm weights, cos/sin).
constexpr int kTableF32 = 0;
constexpr int kTableBf16 = 1;
constexpr int kTableFp16 = 2;

constexpr int kThreads = 256;
constexpr int kHalves = kThreads / 16;  // items side by side in a block
constexpr int kItems = 2;               // items per half, kHalves apart
// At least 3 blocks per SM: ptxas then keeps every instance under 85
// registers without spilling (left to itself it caps them at 64 and spills).
constexpr int kMinBlocks = 3;

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

// x[e] = src[e] for e < 8, as float (16 bytes at once when aligned).
//   src: [8] bf16 or fp16 bits
template <int Src>
__device__ __forceinline__ void load8_half(const std::uint16_t* src, float* x) {
  std::uint32_t w[4];
  if (insert_detail::aligned(src, 16)) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) w[e] = std::uint32_t(src[2 * e]) | (std::uint32_t(src[2 * e + 1]) << 16);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 f = half2_to_float2<Src>(w[e]);
    x[2 * e] = f.x;
    x[2 * e + 1] = f.y;
  }
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
  } else if (tag == kTableBf16) {
    load8_half<insert_detail::kSrcBf16>(static_cast<const std::uint16_t*>(table) + i, out);
  } else {
    load8_half<insert_detail::kSrcFp16>(static_cast<const std::uint16_t*>(table) + i, out);
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

// What one item's loads bring in.
struct Item {
  bool valid = false;
  std::int64_t token = 0;
  std::int32_t head = 0;
  HeadKind kind = HeadKind::q;
  std::int64_t position = 0;
  std::int64_t slot = -1;  // K / V: the main slot; index key: the index slot
  float x[8];
};

template <int Src>
__device__ __forceinline__ void load_item(const PreAttentionParams& p, std::uint32_t item, int c, Item& it) {
  it.valid = item < p.items;
  if (!it.valid) return;
  const std::uint32_t token = p.by_heads.divide(item);
  it.token = token;
  it.head = static_cast<std::int32_t>(item - token * p.heads);
  it.kind = pre::head_kind(it.head, p.nq, p.nkv, p.niq);
  load8_half<Src>(p.qkv + it.token * p.row_stride + std::int64_t(it.head) * kHeadDim + 8 * c, it.x);
  it.position = __ldg(p.positions + it.token);
  if (it.kind == HeadKind::k || it.kind == HeadKind::v) it.slot = __ldg(p.slots + it.token);
  else if (it.kind == HeadKind::index_k) it.slot = __ldg(p.index_slots + it.token);
}

// Steps 1-3 of the SEMANTICS for this lane's 8 values: x becomes u, and
// `bits` holds u in the qkv dtype, packed in pairs.
//   x: [8]   bits: [4]
template <int Src>
__device__ __forceinline__ void norm_rope(const PreAttentionParams& p, const Item& it, int c, unsigned mask,
                                          float* x, std::uint32_t* bits) {
  const void* weight = it.kind == HeadKind::q ? p.q_weight
                       : it.kind == HeadKind::k ? p.k_weight
                       : it.kind == HeadKind::index_q ? p.index_q_weight
                                                      : p.index_k_weight;
  float w[8];
  load8_table(weight, p.weight_tag, 8 * c, w);
  float s = pre::sum_squares8(x);
#pragma unroll
  for (int m = 8; m >= 1; m >>= 1) s = pre::add(s, __shfl_xor_sync(mask, s, m));
  const float r = pre::rms_factor(s, p.eps);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = pre::norm_value(x[e], r, w[e]);

  // RoPE: lanes 0-3 hold y[j] (j < 32), lanes 4-7 y[j + 32]; every lane of the
  // half takes part in the shuffles, lanes 8-15 (dims 64..127) keep their values.
  float partner[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) partner[e] = __shfl_xor_sync(mask, x[e], 4);
  if (c < 8) {
    constexpr int half = kRopeDims / 2;
    float cs[8], sn[8];
    const std::int64_t row = it.position * kRopeDims + 8 * (c & 3);
    load8_table(p.cos_sin, p.cos_sin_tag, row, cs);
    load8_table(p.cos_sin, p.cos_sin_tag, row + half, sn);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] = c < 4 ? pre::rope_first(x[e], partner[e], cs[e], sn[e])
                   : pre::rope_second(partner[e], x[e], cs[e], sn[e]);
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
__device__ __forceinline__ void process_item(const PreAttentionParams& p, Item& it, int c, unsigned mask) {
  if (it.position < 0 || it.position >= p.max_position) {  // the token is skipped whole
    if (it.head == 0 && c == 0)
      detail::record_bad(p.check, detail::kBadPosition, it.token, 0, 0, it.position, p.max_position);
    return;
  }
  const bool lead = c == 0;
  if (it.kind == HeadKind::v) {
    if (it.slot < 0) return;
    if (!slot_in_cache(it.slot, p.cache.num_pages, p.check, detail::kBadSlot, it.token, false)) return;
    const std::int64_t page = it.slot / kBlockSize;
    insert_detail::store_kv8<Dst>(p.cache, page, it.head - p.nq - p.nkv, it.slot - page * kBlockSize, 1, c,
                                  it.x, mask);
    return;
  }
  std::uint32_t bits[4];
  norm_rope<Src>(p, it, c, mask, it.x, bits);
  switch (it.kind) {
    case HeadKind::q:
      store8_output<Src>(p.q, p.q_tag, (it.token * p.nq + it.head) * kHeadDim + 8 * c, it.x, bits, p.q_scale);
      break;
    case HeadKind::index_q:
      store8_output<Src>(p.index_q, p.index_q_tag,
                         (it.token * p.niq + (it.head - p.nq - 2 * p.nkv)) * kHeadDim + 8 * c, it.x, bits, 1.0f);
      break;
    case HeadKind::k: {
      if (it.slot < 0) break;
      const std::int32_t h = it.head - p.nq;
      if (!slot_in_cache(it.slot, p.cache.num_pages, p.check, detail::kBadSlot, it.token, lead && h == 0)) break;
      const std::int64_t page = it.slot / kBlockSize;
      insert_detail::store_kv8<Dst>(p.cache, page, h, it.slot - page * kBlockSize, 0, c, it.x, mask);
      break;
    }
    default: {  // the index key
      if (it.slot < 0) break;
      if (!slot_in_cache(it.slot, p.index_cache.num_pages, p.check, detail::kBadIndexSlot, it.token, lead)) break;
      const std::int64_t page = it.slot / kBlockSize;
      insert_detail::store_index8_tagged(p.index_tag, p.index_cache, page, it.slot - page * kBlockSize, c, it.x,
                                         mask);
      break;
    }
  }
}

template <int Src, int Dst>
__global__ void __launch_bounds__(kThreads, kMinBlocks) pre_attention_kernel(const PreAttentionParams p) {
  const int lane = threadIdx.x & 31;
  const int c = lane & 15;
  const unsigned mask = 0xFFFFu << (lane & 16);  // this half's lanes
  const std::uint32_t first = blockIdx.x * (kHalves * kItems) + (threadIdx.x >> 4);
  Item items[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) load_item<Src>(p, first + k * kHalves, c, items[k]);
#pragma unroll
  for (int k = 0; k < kItems; ++k)
    if (items[k].valid) process_item<Src, Dst>(p, items[k], c, mask);
}

template <int Src>
void launch(const PreAttentionParams& p, int dst, cudaStream_t stream) {
  const dim3 grid((p.items + kHalves * kItems - 1) / (kHalves * kItems));
  insert_detail::with_dst_tag(dst, [&](auto tag) {
    pre_attention_kernel<Src, decltype(tag)::value><<<grid, kThreads, 0, stream>>>(p);
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
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.qkv_dtype == DType::bf16) launch<insert_detail::kSrcBf16>(p, dst, s);
  else launch<insert_detail::kSrcFp16>(p, dst, s);
}

}  // namespace msa::cuda
