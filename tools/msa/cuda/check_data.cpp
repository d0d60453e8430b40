#include "check_data.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "msa/cpu.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "rng.hpp"

namespace msa::tool {

namespace {

// Appends x encoded as `dtype` (bf16, fp16, fp8_e4m3) to bytes.
void push(std::vector<std::uint8_t>& bytes, DType dtype, float x) {
  if (dtype == DType::fp8_e4m3) {
    bytes.push_back(num::float_to_e4m3(x));
    return;
  }
  const std::uint16_t h = dtype == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
  bytes.push_back(std::uint8_t(h & 0xFF));
  bytes.push_back(std::uint8_t(h >> 8));
}

// Assigns pages [0, num_pages) in random order to the blocks of each request.
std::vector<std::int32_t> shuffled_table(Rng& rng, const BatchMetadata& m, std::int32_t stride,
                                         std::int64_t num_pages) {
  std::vector<std::int32_t> pages(std::size_t(num_pages), 0);
  std::iota(pages.begin(), pages.end(), 0);
  rng.shuffle(pages);
  std::vector<std::int32_t> table(std::size_t(m.num_requests) * std::size_t(stride), -1);
  std::size_t next = 0;
  for (std::int32_t r = 0; r < m.num_requests; ++r)
    for (std::int32_t b = 0; b < m.num_blocks(r); ++b) table[std::size_t(r) * std::size_t(stride) + std::size_t(b)] = pages[next++];
  return table;
}

// A placeholder base for computing extents (never dereferenced).
void* placeholder() { return reinterpret_cast<void*>(std::uintptr_t(1) << 20); }

}  // namespace

CheckData make_check_data(const CheckCase& c) {
  CheckData d;
  Rng rng(c.seed ^ 0xD1B54A32D192ED03ull);
  const int H = c.num_kv_heads, QH = c.num_q_heads(), D = kHeadDim;
  d.meta = build_metadata(BatchSpec{c.query_lens, c.seq_lens, c.decode_threshold});
  const BatchMetadata& m = d.meta;

  std::int64_t total_blocks = 0;
  for (std::int32_t r = 0; r < m.num_requests; ++r) {
    total_blocks += m.num_blocks(r);
    d.max_blocks = std::max(d.max_blocks, m.num_blocks(r));
  }
  d.table_stride = d.max_blocks + 2;
  d.num_pages = total_blocks + 3;  // spare pages nobody maps
  d.block_table = shuffled_table(rng, m, d.table_stride, d.num_pages);
  if (c.own_index_table) {
    d.index_pages = total_blocks + 5;
    d.index_table = shuffled_table(rng, m, d.table_stride, d.index_pages);
  } else {
    d.index_pages = d.num_pages;
    d.index_table = d.block_table;
  }
  d.index_bytes = d.index_pages * index_page_bytes(c.index_dtype);
  // Unit-normal index keys: group scales amax / 6 / s of about 25 .. 175, not a power of two.
  if (c.index_dtype == DType::nvfp4) d.index_scale = 1.0f / 300.0f;

  // Main cache geometry; a padded stride packs three layers and views layer 1.
  if (c.kv_dtype == DType::nvfp4) {
    const std::int64_t compact = 2 * std::int64_t(H) * nvfp4::kSlotBytes;
    d.page_stride = c.padded_stride ? 3 * compact : compact;
    d.view_offset = c.padded_stride ? compact : 0;
    d.k_scale = 0.01f;
    d.v_scale = 0.0125f;
  } else {
    const std::int64_t compact = std::int64_t(H) * kBlockSize * 2 * D;
    d.page_stride = c.padded_stride ? 3 * compact : compact;
    d.view_offset = c.padded_stride ? compact * std::int64_t(dtype_bytes(c.kv_dtype)) : 0;
    d.k_scale = 0.02f;
    d.v_scale = 0.025f;
  }
  const KVCacheView shape = main_cache_view(c, d, placeholder(), nullptr, nullptr);
  const std::int64_t eb = c.kv_dtype == DType::nvfp4 ? 1 : std::int64_t(dtype_bytes(c.kv_dtype));
  d.cache_bytes = d.view_offset + cache_extent(shape) * eb;
  if (c.scale_mode == ScaleMode::per_token_head) d.scale_count = d.num_pages * kBlockSize * H;

  // The insert stream: every cached token, in random order, with a few skips.
  std::vector<std::pair<std::int32_t, std::int32_t>> order;  // (request, position); request -1 = skip
  for (std::int32_t r = 0; r < m.num_requests; ++r)
    for (std::int32_t j = 0; j < m.seq_lens[r]; ++j) order.emplace_back(r, j);
  const std::size_t skips = 1 + order.size() / 50;
  for (std::size_t i = 0; i < skips; ++i) order.emplace_back(-1, 0);
  rng.shuffle(order);
  d.num_insert = std::int64_t(order.size());
  for (const auto& [r, j] : order) {
    if (r < 0) {
      d.slots.push_back(-1);
      d.index_slots.push_back(-1);
    } else {
      const std::size_t at = std::size_t(r) * std::size_t(d.table_stride) + std::size_t(j / kBlockSize);
      d.slots.push_back(std::int64_t(d.block_table[at]) * kBlockSize + j % kBlockSize);
      d.index_slots.push_back(std::int64_t(d.index_table[at]) * kBlockSize + j % kBlockSize);
    }
    // K and V of unit variance times a per-(token, head) magnitude in [2^-1.5, 2^1.5],
    // so per-token scales differ and the per-tensor fp8 scale saturates now and then.
    for (int h = 0; h < H; ++h) {
      const float mag_k = std::exp2(float(rng.uniform() * 3.0 - 1.5));
      const float mag_v = std::exp2(float(rng.uniform() * 3.0 - 1.5));
      for (int i = 0; i < D; ++i) push(d.k, c.src_dtype, mag_k * rng.normal());
      for (int i = 0; i < D; ++i) push(d.v, c.src_dtype, mag_v * rng.normal());
    }
    for (int i = 0; i < D; ++i) push(d.index_k, c.src_dtype, rng.normal());
  }

  const std::int64_t T = m.num_tokens;
  for (std::int64_t i = 0; i < T * H * D; ++i) push(d.index_q, c.src_dtype, rng.normal());
  if (c.fp8_index_query) {  // the plain saturating cast of the fp8 index cache
    std::vector<std::uint8_t> e4m3(std::size_t(T * H * D));
    cpu::cast_index_query_e4m3(d.index_q.data(), c.src_dtype, T * H * D, e4m3.data());
    d.index_q = std::move(e4m3);
  }
  d.q_scale = c.q_dtype == DType::fp8_e4m3 ? 1.0f / 64.0f : 1.0f;
  for (std::int64_t i = 0; i < T * QH * D; ++i) push(d.q, c.q_dtype, rng.normal() / d.q_scale);
  return d;
}

KVCacheView main_cache_view(const CheckCase& c, const CheckData& d, void* allocation, float* k_scales,
                            float* v_scales) {
  auto* base = static_cast<unsigned char*>(allocation) + d.view_offset;
  KVCacheView v;
  if (c.kv_dtype == DType::nvfp4) {
    v = make_nvfp4_cache_view(base, d.num_pages, c.num_kv_heads, d.k_scale, d.v_scale, d.page_stride);
  } else {
    v = make_cache_view(c.kv_dtype, base, d.num_pages, c.num_kv_heads, c.layout, d.page_stride);
    v.scale_mode = c.scale_mode;
    if (is_fp8(c.kv_dtype)) {
      v.k_scale = d.k_scale;
      v.v_scale = d.v_scale;
    }
    if (c.scale_mode == ScaleMode::per_token_head) {
      v.k_scales = k_scales;
      v.v_scales = v_scales;
    }
  }
  return v;
}

IndexCacheView index_cache_view(const CheckCase& c, const CheckData& d, void* allocation) {
  return make_index_cache_view(c.index_dtype, allocation, d.index_pages, 0, d.index_scale);
}

BlockTable block_table_view(const CheckData& d, const std::int32_t* table) {
  BlockTable t;
  t.data = table;
  t.num_rows = d.meta.num_requests;
  t.max_blocks = d.max_blocks;
  t.row_stride = d.table_stride;
  return t;
}

}  // namespace msa::tool
