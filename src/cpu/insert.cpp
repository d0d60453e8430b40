// The CPU engine's insert (contract 2 step 1, sections 3-4): K/V rows into the
// main cache in any layout and dtype, index keys into the index cache.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/checks.hpp"
#include "cpu/parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu {

namespace {

constexpr std::int64_t kGrain = 16;  // tokens per parallel_for chunk

// One source row of 128 values, as float.
//   src: [128] of bf16 or fp16 bits
void load_row(const std::uint16_t* src, DType src_dtype, float* out) {
  if (src_dtype == DType::bf16) {
    for (int d = 0; d < kHeadDim; ++d) out[d] = num::bf16_to_float(src[d]);
  } else {
    for (int d = 0; d < kHeadDim; ++d) out[d] = num::fp16_to_float(src[d]);
  }
}

// max |x| over the row; NaN is ignored (as fmaxf does).
float abs_max(const float* x, int n) {
  float m = 0.0f;
  for (int d = 0; d < n; ++d) m = std::fmax(m, std::fabs(x[d]));
  return m;
}

// Writes one row of 128 floats into a bf16/fp16/fp8 cache row, dividing by
// `scale` first for fp8.
//   dst: [128] elements of `dtype`
void store_row(const float* x, DType dtype, float scale, void* dst) {
  switch (dtype) {
    case DType::bf16: {
      auto* o = static_cast<std::uint16_t*>(dst);
      for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_bf16(x[d]);
      break;
    }
    case DType::fp16: {
      auto* o = static_cast<std::uint16_t*>(dst);
      for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_fp16(x[d]);
      break;
    }
    case DType::fp8_e4m3: {
      auto* o = static_cast<std::uint8_t*>(dst);
      for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_e4m3(x[d] / scale);
      break;
    }
    case DType::fp8_e5m2: {
      auto* o = static_cast<std::uint8_t*>(dst);
      for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_e5m2(x[d] / scale);
      break;
    }
    default:
      fail("cpu::insert_kv: cache dtype ", dtype_name(dtype), " is not a packed cache dtype");
  }
}

// Quantizes one row of 128 floats to nvfp4 (contracts 4.2, 4.3): 64 data
// bytes (element 2i in the low nibble of byte i) and 8 group scales.
//   data: [64], scales: [8]
void quantize_nvfp4_row(const float* x, float global_scale, std::uint8_t* data, std::uint8_t* scales) {
  for (int g = 0; g < kHeadDim / nvfp4::kGroup; ++g) {
    const float* gx = x + g * nvfp4::kGroup;
    const std::uint8_t sf = num::nvfp4_group_scale(abs_max(gx, nvfp4::kGroup), global_scale);
    scales[g] = sf;
    for (int i = 0; i < nvfp4::kGroup; i += 2) {
      const std::uint8_t lo = num::nvfp4_encode(gx[i], sf, global_scale);
      const std::uint8_t hi = num::nvfp4_encode(gx[i + 1], sf, global_scale);
      data[(g * nvfp4::kGroup + i) / 2] = std::uint8_t(lo | (hi << 4));
    }
  }
}

// One row into an nvfp4 slot of the main cache (contract 4.3).
//   slot: the slot's base byte ([128 x 64] data, then [128 x 8] scales)
void store_nvfp4_row(const float* x, float global_scale, std::int64_t token, std::uint8_t* slot) {
  quantize_nvfp4_row(x, global_scale, slot + nvfp4::data_offset(token, 0), slot + nvfp4::scale_offset(token, 0));
}

// Scale of one (token, head) row in per_token_head mode: amax / fp8 max, 1
// when amax is 0.
float row_scale(const float* x, float fp8_limit) {
  const float amax = abs_max(x, kHeadDim);
  return amax == 0.0f ? 1.0f : amax / fp8_limit;
}

// K or V of one token and head, already in float, into the cache.
void store_kv_row(const KVCacheView& c, const float* x, bool is_v, std::int64_t page,
                  std::int64_t head, std::int64_t token) {
  if (c.dtype == DType::nvfp4) {
    auto* base = static_cast<std::uint8_t*>(c.k);
    store_nvfp4_row(x, is_v ? c.v_scale : c.k_scale, token,
                    base + nvfp4::slot_offset(c, page, head, is_v ? 1 : 0));
    return;
  }
  float scale = 1.0f;
  if (c.scale_mode == ScaleMode::per_tensor) {
    scale = is_v ? c.v_scale : c.k_scale;
  } else if (c.scale_mode == ScaleMode::per_token_head) {
    scale = row_scale(x, fp8_max(c.dtype));
    (is_v ? c.v_scales : c.k_scales)[c.scale_index(page, head, token)] = scale;
  }
  const std::int64_t eb = std::int64_t(dtype_bytes(c.dtype));
  auto* base = static_cast<std::uint8_t*>(is_v ? c.v : c.k);
  store_row(x, c.dtype, scale, base + c.offset(page, head, token, 0) * eb);
}

}  // namespace

void insert_kv(const KVCacheView& cache, const InsertKVArgs& args, const Options& opt) {
  check_options(opt);
  check::insert_kv_shape(cache, args);
  if (opt.check) check::slots_data(args.slots, args.num_tokens, cache.num_pages, "slots");
  const std::int64_t num_slots = cache.num_pages * kBlockSize;
  const std::int64_t H = cache.num_kv_heads;
  const auto* k_src = static_cast<const std::uint16_t*>(args.k);
  const auto* v_src = static_cast<const std::uint16_t*>(args.v);
  parallel_for(args.num_tokens, opt.num_threads, kGrain, [&](std::int64_t begin, std::int64_t end) {
    float row[kHeadDim];
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t slot = args.slots[i];
      if (slot < 0 || slot >= num_slots) continue;  // padding (or unchecked bad slot)
      const std::int64_t page = slot / kBlockSize, token = slot % kBlockSize;
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t src = (i * H + h) * kHeadDim;
        load_row(k_src + src, args.src_dtype, row);
        store_kv_row(cache, row, false, page, h, token);
        load_row(v_src + src, args.src_dtype, row);
        store_kv_row(cache, row, true, page, h, token);
      }
    }
  });
}

void insert_index(const IndexCacheView& cache, const InsertIndexArgs& args, const Options& opt) {
  check_options(opt);
  check::insert_index_shape(cache, args);
  if (opt.check) check::slots_data(args.slots, args.num_tokens, cache.num_pages, "index slots");
  const std::int64_t num_slots = cache.num_pages * kBlockSize;
  const auto* src = static_cast<const std::uint16_t*>(args.index_k);
  parallel_for(args.num_tokens, opt.num_threads, kGrain * 4, [&](std::int64_t begin, std::int64_t end) {
    float row[kHeadDim];
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t slot = args.slots[i];
      if (slot < 0 || slot >= num_slots) continue;
      load_row(src + i * kHeadDim, args.src_dtype, row);
      if (cache.dtype == DType::nvfp4) {
        auto* o = static_cast<std::uint8_t*>(cache.base) +
                  index_nvfp4::row_offset(cache, slot / kBlockSize, slot % kBlockSize);
        quantize_nvfp4_row(row, cache.global_scale, o, o + index_nvfp4::kDataBytes);
        continue;
      }
      const std::int64_t off = cache.offset(slot / kBlockSize, slot % kBlockSize, 0);
      if (cache.dtype == DType::bf16) {
        auto* o = static_cast<std::uint16_t*>(cache.base) + off;
        for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_bf16(row[d]);
      } else {
        auto* o = static_cast<std::uint8_t*>(cache.base) + off;
        for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_e4m3(row[d]);
      }
    }
  });
}

}  // namespace msa::cpu
