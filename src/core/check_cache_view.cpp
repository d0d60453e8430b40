// Checks of the cache views (contract 4 and 8), shared by every operation and
// backend. A view is valid when every row it addresses lies inside the memory
// it declares and no two rows share an element, except where the layout
// defines it: K and V of a packed page may interleave (HND and NHD put V in
// the gap after each K row, split puts all of V after all of K), and an nvfp4
// page holds both in its head slots. Reads addresses only, never the data.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

constexpr std::int64_t N = kBlockSize, D = kHeadDim;
// Above this many heads, page rows that do not nest are not checked one by one.
constexpr std::int64_t kExactHeads = 512;

bool finite_positive(float x) { return std::isfinite(x) && x > 0.0f; }

const char* scale_mode_name(ScaleMode m) {
  switch (m) {
    case ScaleMode::none: return "none";
    case ScaleMode::per_tensor: return "per_tensor";
    case ScaleMode::per_token_head: return "per_token_head";
  }
  return "unknown";
}

// The head stride that matters: none with one head.
std::int64_t used_head_stride(const KVCacheView& c) { return c.num_kv_heads > 1 ? c.head_stride : 0; }

// Whether the K rows of one page (h * head_stride + t * token_stride, 128
// elements each) and, with_v, the V rows `shift` (>= 0) elements further are
// disjoint by nesting: the inner stride clears a row, the outer one all the
// inner rows, and V comes after all of K or in the gap after each K row.
bool nested(const KVCacheView& c, bool with_v, std::int64_t shift, std::int64_t k_span) {
  struct Dim {
    __int128 count, stride;
  };
  Dim inner{N, c.token_stride}, outer{1, 0};
  if (c.num_kv_heads > 1) {
    outer = Dim{c.num_kv_heads, c.head_stride};
    if (outer.stride < inner.stride) std::swap(inner, outer);
  }
  const bool two = outer.count > 1;
  const bool k_ok = inner.stride >= D && (!two || outer.stride >= (inner.count - 1) * inner.stride + D);
  if (!k_ok || !with_v || shift >= k_span) return k_ok;
  return shift >= D && shift + D <= inner.stride && (!two || outer.stride >= inner.count * inner.stride);
}

struct Row {
  std::int64_t at;  // first element, from the page's start
  int is_v;
  std::int64_t h, t;
};

std::string row_name(const Row& r) {
  return detail::concat(r.is_v ? "V" : "K", "[h=", r.h, ", t=", r.t, "] at element ", r.at);
}

// Row by row: the K rows of one page and, with_v, the V rows `shift` elements
// further, sorted; two that start fewer than 128 elements apart overlap.
void exact_rows(const KVCacheView& c, bool with_v, std::int64_t shift) {
  const std::int64_t H = c.num_kv_heads, hs = used_head_stride(c);
  MSA_CHECK(H <= kExactHeads, "cache.token_stride = ", c.token_stride, " and cache.head_stride = ",
            c.head_stride, " do not nest (one stride at least the span of the other's rows), which "
            "is checked row by row only up to ", kExactHeads, " heads, not num_kv_heads = ", H);
  std::vector<Row> rows;
  rows.reserve(std::size_t(H * N * (with_v ? 2 : 1)));
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t t = 0; t < N; ++t) {
      rows.push_back(Row{h * hs + t * c.token_stride, 0, h, t});
      if (with_v) rows.push_back(Row{h * hs + t * c.token_stride + shift, 1, h, t});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.at < b.at; });
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const Row& a = rows[i - 1];
    const Row& b = rows[i];
    if (b.at - a.at >= D) continue;
    if (a.is_v != b.is_v) {
      fail("cache.v starts ", shift, " elements after cache.k, so K and V rows overlap: ",
           row_name(a), " and ", row_name(b), " of a page (rows are ", D, " elements)");
    }
    fail("cache.token_stride = ", c.token_stride, " and cache.head_stride = ", c.head_stride,
         " make rows overlap: ", row_name(a), " and ", row_name(b), " of a page (rows are ", D,
         " elements)");
  }
}

// Elements of one page's K rows: (H - 1) * head_stride + 127 * token_stride + 128.
std::int64_t k_span_of(const KVCacheView& c) {
  return size_of("one page of cache.k", c.num_kv_heads - 1, used_head_stride(c),
                 size_of("cache.token_stride", N - 1, c.token_stride, D));
}

// Strides and the K/V relation of a bf16 / fp16 / fp8 view.
void check_strides(const KVCacheView& c) {
  const std::int64_t H = c.num_kv_heads;
  MSA_CHECK(c.token_stride >= D, "cache.token_stride = ", c.token_stride, " must be >= ", D,
            " (a row holds ", D, " elements)");
  if (H > 1) {
    MSA_CHECK(c.head_stride >= D, "cache.head_stride = ", c.head_stride, " must be >= ", D,
              " with num_kv_heads = ", H);
  }
  const std::int64_t k_span = k_span_of(c);
  MSA_CHECK(c.page_stride >= k_span, "cache.page_stride = ", c.page_stride, " is smaller than the ",
            k_span, " elements one page of K spans");
  const auto eb = std::int64_t(dtype_bytes(c.dtype));
  // V's distance from K in bytes, as addresses: K and V may be separate
  // allocations. They share memory when their regions intersect.
  const __int128 diff = __int128(reinterpret_cast<std::uintptr_t>(c.v)) -
                        __int128(reinterpret_cast<std::uintptr_t>(c.k));
  bool joint = false;
  if (c.num_pages > 0) {
    const std::int64_t region =
        size_of("cache.k", size_of("cache.page_stride x num_pages", c.num_pages - 1, c.page_stride, k_span), eb);
    joint = diff < region && -diff < region;
  }
  if (!joint) {
    if (!nested(c, false, 0, k_span)) exact_rows(c, false, 0);
    return;
  }
  MSA_CHECK(diff % eb == 0, "cache.v is ", std::int64_t(diff), " bytes from cache.k, not a whole number of ",
            dtype_name(c.dtype), " elements");
  const auto shift = std::int64_t(diff / eb);
  const std::int64_t distance = shift < 0 ? -shift : shift;
  if (!nested(c, true, distance, k_span)) exact_rows(c, true, shift);
  const std::int64_t span = k_span + distance;
  MSA_CHECK(c.page_stride >= span, "cache.page_stride = ", c.page_stride, " is smaller than the ", span,
            " elements one page of K and V spans");
}

void check_scales(const KVCacheView& c) {
  switch (c.dtype) {
    case DType::bf16:
    case DType::fp16:
      MSA_CHECK(c.scale_mode == ScaleMode::none, "cache.scale_mode = ", scale_mode_name(c.scale_mode),
                " does not go with a ", dtype_name(c.dtype), " cache (expected none)");
      return;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      if (c.scale_mode == ScaleMode::per_token_head) {
        MSA_CHECK(c.k_scales != nullptr, "cache.k_scales is null but cache.scale_mode = per_token_head");
        MSA_CHECK(c.v_scales != nullptr, "cache.v_scales is null but cache.scale_mode = per_token_head");
        aligned("cache.k_scales", c.k_scales, sizeof(float), "float");
        aligned("cache.v_scales", c.v_scales, sizeof(float), "float");
        return;
      }
      MSA_CHECK(c.scale_mode == ScaleMode::per_tensor, "cache.scale_mode = ", scale_mode_name(c.scale_mode),
                " does not go with a ", dtype_name(c.dtype), " cache (expected per_tensor or per_token_head)");
      MSA_CHECK(finite_positive(c.k_scale), "cache.k_scale = ", c.k_scale, " must be finite and positive");
      MSA_CHECK(finite_positive(c.v_scale), "cache.v_scale = ", c.v_scale, " must be finite and positive");
      return;
    case DType::nvfp4:
      MSA_CHECK(c.scale_mode != ScaleMode::per_token_head, "cache.scale_mode = ",
                scale_mode_name(c.scale_mode),
                " does not go with an nvfp4 cache (expected per_tensor: one global scale each for K and V)");
      MSA_CHECK(finite_positive(c.k_scale), "cache.k_scale = ", c.k_scale,
                " (nvfp4 global scale of K) must be finite and positive");
      MSA_CHECK(finite_positive(c.v_scale), "cache.v_scale = ", c.v_scale,
                " (nvfp4 global scale of V) must be finite and positive");
      return;
    default:
      fail("cache.dtype = ", dtype_name(c.dtype),
           " is not a KV cache dtype (expected bf16, fp16, fp8_e4m3, fp8_e5m2 or nvfp4)");
  }
}

}  // namespace

void cache_view(const KVCacheView& c) {
  MSA_CHECK(c.num_pages >= 0, "cache.num_pages = ", c.num_pages, " must be >= 0");
  MSA_CHECK(c.num_kv_heads >= 1, "cache.num_kv_heads = ", c.num_kv_heads, " must be >= 1");
  if (c.num_pages > 0) {
    MSA_CHECK(c.k != nullptr, "cache.k is null");
    MSA_CHECK(c.v != nullptr, "cache.v is null");
  }
  check_scales(c);
  if (c.dtype == DType::nvfp4) {
    MSA_CHECK(c.k == c.v, "cache.v differs from cache.k but an nvfp4 cache is one head-slot "
              "allocation (use make_nvfp4_cache_view)");
    const std::int64_t page = size_of("one nvfp4 page", 2 * std::int64_t(c.num_kv_heads), nvfp4::kSlotBytes);
    MSA_CHECK(c.page_stride >= page, "cache.page_stride = ", c.page_stride,
              " bytes is smaller than one nvfp4 page (", page, " bytes for ", c.num_kv_heads, " KV heads)");
  } else {
    const auto eb = std::int64_t(dtype_bytes(c.dtype));
    aligned("cache.k", c.k, eb, dtype_name(c.dtype));
    aligned("cache.v", c.v, eb, dtype_name(c.dtype));
    check_strides(c);
  }
  // The memory the view declares must be addressable; the scales must not
  // share memory with the pages (insert writes both).
  const CacheSpans s = cache_spans(c);
  no_overlap(s.k_scales, s.v_scales);
  for (const Span* scales : {&s.k_scales, &s.v_scales}) {
    no_overlap(*scales, s.k);
    no_overlap(*scales, s.v);
  }
}

CacheSpans cache_spans(const KVCacheView& c) {
  CacheSpans s;
  if (c.num_pages <= 0) return s;
  if (c.dtype == DType::nvfp4) {
    const std::int64_t page = size_of("one nvfp4 page", 2 * std::int64_t(c.num_kv_heads), nvfp4::kSlotBytes);
    s.k = span_at("cache.k", c.k, size_of("cache.k", c.num_pages - 1, c.page_stride, page));
    return s;  // V lives in the same head-slot pages
  }
  const auto eb = std::int64_t(dtype_bytes(c.dtype));
  const std::int64_t bytes =
      size_of("cache.k", size_of("cache.page_stride x num_pages", c.num_pages - 1, c.page_stride, k_span_of(c)), eb);
  s.k = span_at("cache.k", c.k, bytes);
  s.v = span_at("cache.v", c.v, bytes);
  if (is_fp8(c.dtype) && c.scale_mode == ScaleMode::per_token_head) {
    const std::int64_t scales = size_of("cache.k_scales", size_of("cache.k_scales", c.num_pages, N * c.num_kv_heads),
                                        sizeof(float));
    s.k_scales = span_at("cache.k_scales", c.k_scales, scales);
    s.v_scales = span_at("cache.v_scales", c.v_scales, scales);
  }
  return s;
}

void index_cache_view(const IndexCacheView& c) {
  MSA_CHECK(c.dtype == DType::bf16 || c.dtype == DType::fp8_e4m3 || c.dtype == DType::nvfp4, "index_cache.dtype = ",
            dtype_name(c.dtype), " is not an index cache dtype (expected bf16, fp8_e4m3 or nvfp4)");
  MSA_CHECK(c.num_pages >= 0, "index_cache.num_pages = ", c.num_pages, " must be >= 0");
  if (c.num_pages > 0) MSA_CHECK(c.base != nullptr, "index_cache.base is null");
  const bool fp4 = c.dtype == DType::nvfp4;
  const std::int64_t page = fp4 ? index_nvfp4::kPageBytes : std::int64_t(kBlockSize) * kHeadDim;
  MSA_CHECK(c.page_stride >= page, "index_cache.page_stride = ", c.page_stride,
            " is smaller than one page (", page, fp4 ? " bytes)" : " elements)");
  MSA_CHECK(!fp4 || finite_positive(c.global_scale), "index_cache.global_scale = ", c.global_scale,
            " must be finite and positive");
  if (!fp4) aligned("index_cache.base", c.base, std::int64_t(dtype_bytes(c.dtype)), dtype_name(c.dtype));
  index_cache_span(c);
}

Span index_cache_span(const IndexCacheView& c) {
  if (c.num_pages <= 0) return Span{"index_cache", 0, 0};
  if (c.dtype == DType::nvfp4) {  // page_stride in bytes
    return span_at("index_cache", c.base,
                   size_of("index_cache", c.num_pages - 1, c.page_stride, index_nvfp4::kPageBytes));
  }
  const std::int64_t elements =
      size_of("index_cache", c.num_pages - 1, c.page_stride, std::int64_t(kBlockSize) * kHeadDim);
  return span_at("index_cache", c.base,
                 size_of("index_cache", elements, std::int64_t(dtype_bytes(c.dtype))));
}

}  // namespace msa::check
