// The inserts' row stores, shared by insert_kv, insert_index and the fused
// pre-attention kernel so that every writer of a cache quantizes the same way:
// `Lanes` lanes (16 or 8) hold one row of 128 values, lane c the groups of 8
// elements c + Lanes * g for g < 16 / Lanes (in x[8g .. 8g+7]), and store it
// into the main cache (any dtype, layout and scale mode) or into the index
// cache (insert_util.cuh's element stores and nvfp4 quantizer). Row reductions
// (per-(token, head) amax, nvfp4 group amax) are shuffles among the lanes
// named by `mask`, which must all take part. An nvfp4 group of 16 elements is
// a lane pair in both layouts.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/insert/insert_util.cuh"
#include "msa/cache.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cuda::insert_detail {

// K (is_v 0) or V (is_v 1) of KV head `head` at (page, token): this lane's
// groups of the row (x: [128 / Lanes]). fp8 per_token_head rows write their
// scale (amax / fp8 max, 1 when amax is 0) from lane 0 of the row.
template <int Dst, int Lanes = 16>
__device__ __forceinline__ void store_kv_row(const KVCacheView& cache, std::int64_t page,
                                             std::int64_t head, std::int64_t token, int is_v, int c,
                                             const float* x, unsigned mask) {
  static_assert(Lanes == 16 || Lanes == 8, "a row is held by 16 or 8 lanes");
  constexpr int kGroups = 16 / Lanes;
  if constexpr (Dst == kDstNvfp4) {
    auto* slot = static_cast<std::uint8_t*>(cache.k) + nvfp4::slot_offset(cache, page, head, is_v);
    const FloatDivisor global(is_v ? cache.v_scale : cache.k_scale);
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      store_nvfp4_8(x + 8 * g, global, c + Lanes * g, mask, slot + nvfp4::data_offset(token, 0),
                    slot + nvfp4::scale_offset(token, 0));
  } else {
    float scale = 1.0f;
    if constexpr (Dst == kDstE4m3 || Dst == kDstE5m2) {
      if (cache.scale_mode == ScaleMode::per_tensor) {
        scale = is_v ? cache.v_scale : cache.k_scale;
      } else if (cache.scale_mode == ScaleMode::per_token_head) {
        float amax = 0.0f;
#pragma unroll
        for (int e = 0; e < 8 * kGroups; ++e) amax = fmaxf(amax, fabsf(x[e]));
#pragma unroll
        for (int m = Lanes / 2; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, m));
        constexpr float kFp8Max = Dst == kDstE4m3 ? 448.0f : 57344.0f;
        scale = amax == 0.0f ? 1.0f : amax / kFp8Max;
        if (c == 0) (is_v ? cache.v_scales : cache.k_scales)[cache.scale_index(page, head, token)] = scale;
      }
    }
    void* base = is_v ? cache.v : cache.k;
    if constexpr (Dst == kDstE4m3 || Dst == kDstE5m2) {
      const FloatDivisor divisor(scale);
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
        store8<Dst>(base, cache.offset(page, head, token, 8 * (c + Lanes * g)), x + 8 * g, divisor);
    } else {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) store8<Dst>(base, cache.offset(page, head, token, 8 * (c + Lanes * g)), x + 8 * g);
    }
  }
}

// ---- index cache ------------------------------------------------------------------
// The tag of an index cache dtype; throws msa::Error naming `what` for any other.
inline int index_dst_tag(DType t, const char* what) {
  switch (t) {
    case DType::bf16: return kDstBf16;
    case DType::fp8_e4m3: return kDstE4m3;
    case DType::nvfp4: return kDstNvfp4;
    default: fail(what, " = ", dtype_name(t), " is not an index cache dtype (expected bf16, fp8_e4m3 or nvfp4)");
  }
}

// The index key of (page, token): this lane's groups of the row (x: [128 /
// Lanes]; nvfp4: the 72-byte row of contract 4.2 under the cache's global scale).
template <int Dst, int Lanes = 16>
__device__ __forceinline__ void store_index_row(const IndexCacheView& cache, std::int64_t page,
                                                std::int64_t token, int c, const float* x, unsigned mask) {
  static_assert(Lanes == 16 || Lanes == 8, "a row is held by 16 or 8 lanes");
  constexpr int kGroups = 16 / Lanes;
  if constexpr (Dst == kDstNvfp4) {
    std::uint8_t* row = static_cast<std::uint8_t*>(cache.base) + index_nvfp4::row_offset(cache, page, token);
    const FloatDivisor global(cache.global_scale);
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      store_nvfp4_8(x + 8 * g, global, c + Lanes * g, mask, row, row + index_nvfp4::kDataBytes);
  } else {
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      store8<Dst>(cache.base, cache.offset(page, token, 8 * (c + Lanes * g)), x + 8 * g);
  }
}

// store_index_row for a tag known at run time (index_dst_tag), for kernels
// that serve every index dtype from one instance.
template <int Lanes = 16>
__device__ __forceinline__ void store_index_row_tagged(int tag, const IndexCacheView& cache,
                                                       std::int64_t page, std::int64_t token, int c,
                                                       const float* x, unsigned mask) {
  switch (tag) {
    case kDstE4m3: store_index_row<kDstE4m3, Lanes>(cache, page, token, c, x, mask); break;
    case kDstNvfp4: store_index_row<kDstNvfp4, Lanes>(cache, page, token, c, x, mask); break;
    default: store_index_row<kDstBf16, Lanes>(cache, page, token, c, x, mask); break;
  }
}

}  // namespace msa::cuda::insert_detail
