#include "cache_reader.hpp"

#include <cstdint>

#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::ref {

namespace {

constexpr int kDim = 128;

// One token row (128 values) of a bf16 / fp16 / fp8 cache.
//   base: K or V base, row: element offset of the token's first value; out: [128]
void read_row(const KVCacheView& c, const void* base, std::int64_t row, double scale, double* out) {
  for (int d = 0; d < kDim; ++d) out[d] = read_element(base, c.dtype, row + d) * scale;
}

// Dequant scale of (page, head, token) for K (is_v 0) or V.
double fp8_scale(const KVCacheView& c, std::int64_t page, std::int64_t head, std::int64_t token,
                 int is_v) {
  switch (c.scale_mode) {
    case ScaleMode::none: return 1.0;
    case ScaleMode::per_tensor: return is_v ? c.v_scale : c.k_scale;
    case ScaleMode::per_token_head: {
      const float* s = is_v ? c.v_scales : c.k_scales;  // [num_pages * 128, num_kv_heads]
      MSA_CHECK(s != nullptr, "cache reader: per_token_head scales are null");
      return s[c.scale_index(page, head, token)];
    }
  }
  return 1.0;
}

// One token row of an nvfp4 head-slot page (contract 4.3).   out: [128]
void read_nvfp4_row(const KVCacheView& c, std::int64_t page, std::int64_t head, std::int64_t token,
                    int is_v, double* out) {
  const auto* slot = static_cast<const std::uint8_t*>(c.k) + nvfp4::slot_offset(c, page, head, is_v);
  const double global = is_v ? c.v_scale : c.k_scale;
  for (int i = 0; i < kDim / 2; ++i) {
    const std::uint8_t byte = slot[nvfp4::data_offset(token, i)];
    const int e0 = 2 * i, e1 = 2 * i + 1;
    const double s0 = num::e4m3_to_float(slot[nvfp4::scale_offset(token, e0 / nvfp4::kGroup)]);
    const double s1 = num::e4m3_to_float(slot[nvfp4::scale_offset(token, e1 / nvfp4::kGroup)]);
    out[e0] = double(num::e2m1_to_float(byte & 0xF)) * s0 * global;
    out[e1] = double(num::e2m1_to_float(byte >> 4)) * s1 * global;
  }
}

}  // namespace

double read_element(const void* data, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::bf16: return num::bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::fp16: return num::fp16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::fp8_e4m3: return num::e4m3_to_float(static_cast<const std::uint8_t*>(data)[i]);
    case DType::fp8_e5m2: return num::e5m2_to_float(static_cast<const std::uint8_t*>(data)[i]);
    case DType::f32: return static_cast<const float*>(data)[i];
    default: break;
  }
  fail("read_element: dtype ", dtype_name(dtype), " is not an element type");
}

std::vector<double> read_array(const void* data, DType dtype, std::int64_t n, double scale) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) out[i] = read_element(data, dtype, i) * scale;
  return out;
}

std::vector<double> read_query(const AttentionArgs& args, std::int64_t num_tokens) {
  const double scale = args.q_dtype == DType::fp8_e4m3 ? double(args.q_scale) : 1.0;
  return read_array(args.q, args.q_dtype, num_tokens * args.num_q_heads * kDim, scale);
}

void read_kv(const KVCacheView& cache, const BlockTable& table, std::int32_t r, std::int32_t head,
             std::int64_t seq_len, double* k, double* v) {
  MSA_CHECK(head >= 0 && head < cache.num_kv_heads, "cache reader: head ", head,
            " is outside the cache's ", cache.num_kv_heads, " KV heads");
  for (std::int64_t j = 0; j < seq_len; ++j) {
    const std::int64_t page = table.at(r, j / kBlockSize);
    const std::int64_t token = j % kBlockSize;
    MSA_CHECK(page >= 0 && page < cache.num_pages, "cache reader: block_table[r=", r, ", b=",
              j / kBlockSize, "] = ", page, " but the cache has ", cache.num_pages, " pages");
    read_kv_row(cache, page, head, token, k + j * kDim, v + j * kDim);
  }
}

void read_kv_row(const KVCacheView& cache, std::int64_t page, std::int32_t head, std::int64_t token, double* k,
                 double* v) {
  if (cache.dtype == DType::nvfp4) {
    read_nvfp4_row(cache, page, head, token, 0, k);
    read_nvfp4_row(cache, page, head, token, 1, v);
    return;
  }
  const std::int64_t row = cache.offset(page, head, token, 0);
  read_row(cache, cache.k, row, fp8_scale(cache, page, head, token, 0), k);
  read_row(cache, cache.v, row, fp8_scale(cache, page, head, token, 1), v);
}

void read_index_row(const IndexCacheView& cache, std::int64_t page, std::int64_t token, double* out) {
  MSA_CHECK(page >= 0 && page < cache.num_pages, "cache reader: index page ", page, " but the index cache has ",
            cache.num_pages, " pages");
  if (cache.dtype != DType::nvfp4) {
    const std::int64_t row = cache.offset(page, token, 0);
    for (int d = 0; d < kDim; ++d) out[d] = read_element(cache.base, cache.dtype, row + d);
    return;
  }
  const auto* row = static_cast<const std::uint8_t*>(cache.base) + index_nvfp4::row_offset(cache, page, token);
  const std::uint8_t* scales = row + index_nvfp4::kDataBytes;
  for (int d = 0; d < kDim; ++d) {
    const std::uint8_t code = (d % 2) ? row[d / 2] >> 4 : row[d / 2] & 0xF;
    out[d] = double(num::e2m1_to_float(code)) * num::e4m3_to_float(scales[d / nvfp4::kGroup]) *
             double(cache.global_scale);
  }
}

HeadKV read_kv(const KVCacheView& cache, const BlockTable& table, std::int32_t r,
               std::int32_t head, std::int64_t seq_len) {
  HeadKV kv;
  kv.k.resize(static_cast<std::size_t>(seq_len * kDim));
  kv.v.resize(static_cast<std::size_t>(seq_len * kDim));
  read_kv(cache, table, r, head, seq_len, kv.k.data(), kv.v.data());
  return kv;
}

}  // namespace msa::ref
