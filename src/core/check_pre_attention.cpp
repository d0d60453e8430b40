// Input checks of pre-attention: every message names the argument, the index
// and the value.
#include "core/check_pre_attention.hpp"

#include <cmath>
#include <cstdint>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

bool small_table_dtype(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::fp16; }

bool output_dtype(DType t) { return is_half(t) || t == DType::fp8_e4m3; }

}  // namespace

void pre_attention_shape(const KVCacheView& cache, const IndexCacheView& index_cache,
                         const PreAttentionArgs& a) {
  cache_view(cache);
  index_cache_view(index_cache);
  MSA_CHECK(a.num_tokens >= 0, "num_tokens = ", a.num_tokens, " must be >= 0");
  MSA_CHECK(is_half(a.qkv_dtype), "qkv_dtype = ", dtype_name(a.qkv_dtype),
            " is not a qkv dtype (expected bf16 or fp16)");
  MSA_CHECK(a.num_q_heads >= 1, "num_q_heads = ", a.num_q_heads, " must be >= 1");
  MSA_CHECK(a.num_kv_heads == cache.num_kv_heads, "num_kv_heads = ", a.num_kv_heads,
            " but cache.num_kv_heads = ", cache.num_kv_heads);
  MSA_CHECK(a.num_index_heads >= 1, "num_index_heads = ", a.num_index_heads, " must be >= 1");
  MSA_CHECK(a.qkv_row_stride == 0 || a.qkv_row_stride >= a.row_width(), "qkv_row_stride = ",
            a.qkv_row_stride, " is smaller than a row of ", a.heads_per_token(), " heads (",
            a.row_width(), " elements: ", a.num_q_heads, " + 2 * ", a.num_kv_heads, " + ",
            a.num_index_heads, " + 1 heads of 128)");
  MSA_CHECK(small_table_dtype(a.weight_dtype), "weight_dtype = ", dtype_name(a.weight_dtype),
            " is not a norm weight dtype (expected f32, bf16 or fp16)");
  MSA_CHECK(small_table_dtype(a.cos_sin_dtype), "cos_sin_dtype = ", dtype_name(a.cos_sin_dtype),
            " is not a cos/sin table dtype (expected f32, bf16 or fp16)");
  MSA_CHECK(std::isfinite(a.eps) && a.eps >= 0.0f, "eps = ", a.eps, " must be finite and >= 0");
  MSA_CHECK(output_dtype(a.q_dtype), "q_dtype = ", dtype_name(a.q_dtype),
            " is not a query dtype (expected bf16, fp16 or fp8_e4m3)");
  if (a.q_dtype == DType::fp8_e4m3)
    MSA_CHECK(std::isfinite(a.q_scale) && a.q_scale > 0.0f, "q_scale = ", a.q_scale,
              " must be finite and positive with q_dtype = fp8_e4m3");
  MSA_CHECK(output_dtype(a.index_q_dtype), "index_q_dtype = ", dtype_name(a.index_q_dtype),
            " is not an index query dtype (expected bf16, fp16 or fp8_e4m3)");
  if (a.index_q_dtype == DType::fp8_e4m3)
    MSA_CHECK(index_cache.dtype == DType::fp8_e4m3, "index_q_dtype = fp8_e4m3 goes only with an ",
              "fp8_e4m3 index cache (index_cache.dtype = ", dtype_name(index_cache.dtype), ")");
  MSA_CHECK(a.max_position >= 0, "max_position = ", a.max_position, " must be >= 0");
  if (a.num_tokens == 0) return;
  const auto present = [&](const void* p, const char* name) {
    MSA_CHECK(p != nullptr, name, " is null with num_tokens = ", a.num_tokens);
  };
  present(a.qkv, "qkv");
  present(a.positions, "positions");
  present(a.q_weight, "q_weight");
  present(a.k_weight, "k_weight");
  present(a.index_q_weight, "index_q_weight");
  present(a.index_k_weight, "index_k_weight");
  present(a.cos_sin, "cos_sin");
  present(a.q, "q");
  present(a.index_q, "index_q");
  present(a.slots, "slots");
  MSA_CHECK(a.max_position >= 1, "max_position = 0: the cos_sin table has no rows for ",
            a.num_tokens, " tokens");

  // The views: aligned, addressable, and no output sharing memory with an input.
  const Span qkv = dense_view(a.qkv, a.qkv_dtype, size_of("qkv", a.num_tokens - 1, a.row_stride(), a.row_width()), "qkv");
  const auto int64s = [&](const std::int64_t* p, const char* name) {
    aligned(name, p, sizeof(std::int64_t), "int64 entries");
    return span_at(name, p, size_of(name, a.num_tokens, sizeof(std::int64_t)));
  };
  const Span read[] = {
      qkv,
      int64s(a.positions, "positions"),
      int64s(a.slots, "slots"),
      a.index_slots ? int64s(a.index_slots, "index_slots") : Span{},
      dense_view(a.q_weight, a.weight_dtype, kHeadDim, "q_weight"),
      dense_view(a.k_weight, a.weight_dtype, kHeadDim, "k_weight"),
      dense_view(a.index_q_weight, a.weight_dtype, kHeadDim, "index_q_weight"),
      dense_view(a.index_k_weight, a.weight_dtype, kHeadDim, "index_k_weight"),
      dense_view(a.cos_sin, a.cos_sin_dtype, size_of("cos_sin", a.max_position, 64), "cos_sin")};
  const CacheSpans c = cache_spans(cache);
  const Span written[] = {
      dense_view(a.q, a.q_dtype, size_of("q", a.num_tokens, std::int64_t(a.num_q_heads) * kHeadDim), "q"),
      dense_view(a.index_q, a.index_q_dtype, size_of("index_q", a.num_tokens, std::int64_t(a.num_index_heads) * kHeadDim),
                 "index_q"),
      c.k, c.v, c.k_scales, c.v_scales, index_cache_span(index_cache)};
  for (const Span& w : written)
    for (const Span& r : read) no_overlap(w, r);
  no_overlap(written[0], written[1]);
  for (int i = 2; i < 7; ++i) {
    no_overlap(written[0], written[i]);
    no_overlap(written[1], written[i]);
  }
  no_overlap(written[6], c.k);
  no_overlap(written[6], c.v);
}

void pre_attention_data(const KVCacheView& cache, const IndexCacheView& index_cache,
                        const PreAttentionArgs& a) {
  if (a.num_tokens <= 0) return;
  for (std::int64_t i = 0; i < a.num_tokens; ++i) {
    const std::int64_t p = a.positions[i];
    MSA_CHECK(p >= 0 && p < a.max_position, "positions[", i, "] = ", p,
              " is outside the cos_sin table (max_position = ", a.max_position, " rows)");
  }
  slots_data(a.slots, a.num_tokens, cache.num_pages, "slots");
  if (a.index_slots != nullptr) {
    slots_data(a.index_slots, a.num_tokens, index_cache.num_pages, "index_slots");
  } else {
    const std::int64_t limit = index_cache.num_pages * kBlockSize;
    for (std::int64_t i = 0; i < a.num_tokens; ++i)
      MSA_CHECK(a.slots[i] < limit, "slots[", i, "] = ", a.slots[i], " but the index cache has ",
                index_cache.num_pages, " pages (", limit,
                " slots; index_slots is null, so slots maps the index cache too)");
  }
}

}  // namespace msa::check
