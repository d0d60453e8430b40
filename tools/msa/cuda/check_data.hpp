// Host-side inputs of one `msa check` case: batch metadata, shuffled pages and
// block tables, the insert stream (K, V, index keys, slots), queries and index
// queries. Everything is a pure function of the case (and its seed).
#pragma once

#include <cstdint>
#include <vector>

#include "check_cases.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"

namespace msa::tool {

struct CheckData {
  BatchMetadata meta;
  std::int32_t max_blocks = 1;  // max ceil(seq_len / 128) over the requests, at least 1

  // Main cache: one allocation of cache_bytes; the view starts view_offset bytes in.
  std::int64_t num_pages = 0;
  std::int64_t page_stride = 0;  // elements (bytes for nvfp4)
  std::int64_t view_offset = 0;  // bytes
  std::int64_t cache_bytes = 0;
  std::int64_t scale_count = 0;  // per_token_head: floats per scale array (num_pages * 128 * H)
  float k_scale = 1.0f;          // fp8 per-tensor scale / nvfp4 global scale
  float v_scale = 1.0f;

  // Block tables [num_requests, table_stride]; columns past a request's blocks are -1.
  std::int32_t table_stride = 1;
  std::vector<std::int32_t> block_table;
  std::int64_t index_pages = 0;
  std::int64_t index_bytes = 0;
  float index_scale = 1.0f;  // nvfp4 index cache: its global scale
  std::vector<std::int32_t> index_table;

  // The insert stream: every cached token of every request (shuffled), plus
  // padding entries with slot -1.
  std::int64_t num_insert = 0;
  std::vector<std::int64_t> slots;        // [num_insert] main cache
  std::vector<std::int64_t> index_slots;  // [num_insert] index cache
  std::vector<std::uint8_t> k;            // [num_insert, H, 128] src_dtype
  std::vector<std::uint8_t> v;            // [num_insert, H, 128] src_dtype
  std::vector<std::uint8_t> index_k;      // [num_insert, 128] src_dtype

  // The step's queries.
  std::vector<std::uint8_t> index_q;  // [num_tokens, H, 128] c.iq_dtype()
  std::vector<std::uint8_t> q;        // [num_tokens, num_q_heads, 128] q_dtype
  float q_scale = 1.0f;               // fp8 query dequant scale
};

CheckData make_check_data(const CheckCase& c);

// Views of the caches on an allocation of d.cache_bytes (index: d.index_bytes)
// bytes, host or device. k_scales / v_scales: [d.scale_count] for per_token_head.
KVCacheView main_cache_view(const CheckCase& c, const CheckData& d, void* allocation, float* k_scales,
                            float* v_scales);
IndexCacheView index_cache_view(const CheckCase& c, const CheckData& d, void* allocation);
//   table: [num_requests, d.table_stride]
BlockTable block_table_view(const CheckData& d, const std::int32_t* table);

}  // namespace msa::tool
