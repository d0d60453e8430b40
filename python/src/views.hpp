// msa's views (include/msa/cache.hpp, batch.hpp, ops.hpp) over Python arrays,
// read from the arrays' shapes and strides. One function per view, shared by
// every operation's binding.
#pragma once

#include <cstdint>

#include "arrays.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/ops.hpp"

namespace msa::py {

// A KV cache and how its values are scaled, as the bindings receive it.
struct KVCacheArgs {
  Array cache;
  // bf16 / fp16 / fp8_e4m3 / fp8_e5m2:
  //   [num_pages, num_kv_heads, 128, 256]: K in [..., :128], V in [..., 128:], any
  //     page, head and token strides (HND, NHD, layer- or block-outer packing);
  //   [num_pages, 2, 128, num_kv_heads, 128]: separate K and V planes ("split").
  // nvfp4 (uint8): [num_pages, 2 * num_kv_heads, 128, 72] head-slot pages
  //   (slot 2h: head h's K, 2h + 1 its V), any page stride.
  OptString dtype;        // needed for uint8 / uint16 arrays
  float k_scale = 1.0f;   // fp8 per-tensor scale; nvfp4 global scale
  float v_scale = 1.0f;
  OptArray k_scales;      // fp8 per-(token, head) scales: [num_pages * 128, num_kv_heads] f32
  OptArray v_scales;
};

// Also describes which layout the strides match, for messages and describe().
KVCacheView kv_cache_view(const KVCacheArgs& a, Placement& where, const char** layout = nullptr);

// [num_pages, 128, 128] index keys, bf16 or fp8_e4m3; any page stride.
IndexCacheView index_cache_view(const Array& cache, const OptString& dtype, Placement& where);

// [num_rows, max_blocks] int32, rows at any stride.
BlockTable block_table_view(const Array& table, const char* arg, Placement& where);

// [num_tokens, num_kv_heads, topk] int32 with any token and head strides (a
// [kv_head, token, topk] buffer passed as its transpose works as it is).
TopkView topk_view(const Array& topk, const char* arg, Placement& where);

// The step as the kernels read it: the three arrays of BatchMetadata on the
// call's device, plus the decode split.
struct StepArgs {
  Array query_start;    // [num_requests + 1] int32
  Array seq_lens;       // [num_requests] int32
  Array token_request;  // [num_tokens] int32
  std::int32_t num_decodes = 0;
  std::int32_t decode_query_len = 0;
};
StepView step_view(const StepArgs& s, Placement& where);

}  // namespace msa::py
