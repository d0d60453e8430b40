// Input checks of the insert operations (contract 8): cache views, argument
// shapes and dtypes, and slot values. Every message names the argument, the
// index and the value.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

bool finite_positive(float x) { return std::isfinite(x) && x > 0.0f; }

const char* scale_mode_name(ScaleMode m) {
  switch (m) {
    case ScaleMode::none: return "none";
    case ScaleMode::per_tensor: return "per_tensor";
    case ScaleMode::per_token_head: return "per_token_head";
  }
  return "unknown";
}

// Distance from K's base to V's base in elements (as addresses: K and V may be
// separate allocations).
std::int64_t v_shift_elements(const KVCacheView& c) {
  const auto k = std::int64_t(reinterpret_cast<std::uintptr_t>(c.k));
  const auto v = std::int64_t(reinterpret_cast<std::uintptr_t>(c.v));
  return (v - k) / std::int64_t(dtype_bytes(c.dtype));
}

// Exact test that the rows of one page, K rows at h*head_stride +
// t*token_stride and V rows `v_shift` further, never share an element.
void check_rows_disjoint(const KVCacheView& c, std::int64_t v_shift) {
  std::vector<std::int64_t> rows;
  for (std::int64_t h = 0; h < c.num_kv_heads; ++h)
    for (std::int64_t t = 0; t < kBlockSize; ++t) {
      rows.push_back(c.offset(0, h, t, 0));
      rows.push_back(c.offset(0, h, t, 0) + v_shift);
    }
  std::sort(rows.begin(), rows.end());
  for (std::size_t i = 1; i < rows.size(); ++i)
    MSA_CHECK(rows[i] - rows[i - 1] >= kHeadDim, "cache.v starts ", v_shift,
              " elements after cache.k, so K and V rows overlap (at element ", rows[i],
              " of a page)");
}

// The rows of one page (128 contiguous elements each, K at
// head*head_stride + token*token_stride, V likewise from its base) must be
// disjoint and fit in one page stride. The strides must nest (the inner one at
// least 128); V either follows all of a page's K or fits in the gaps between
// K rows (HND, NHD, split), else an exact test decides.
void check_strides(const KVCacheView& c) {
  const std::int64_t H = c.num_kv_heads, N = kBlockSize, D = kHeadDim;
  MSA_CHECK(c.token_stride >= D, "cache.token_stride = ", c.token_stride, " must be >= ", D);
  std::int64_t inner = c.token_stride;
  if (H > 1) {
    MSA_CHECK(c.head_stride >= D, "cache.head_stride = ", c.head_stride, " must be >= ", D,
              " with num_kv_heads = ", H);
    if (c.head_stride < c.token_stride) {
      MSA_CHECK(c.token_stride >= H * c.head_stride, "cache.token_stride = ", c.token_stride,
                " overlaps the ", H, " heads of head_stride ", c.head_stride);
      inner = c.head_stride;
    } else {
      MSA_CHECK(c.head_stride >= N * c.token_stride, "cache.head_stride = ", c.head_stride,
                " overlaps the ", N, " tokens of token_stride ", c.token_stride);
    }
  }
  const std::int64_t k_span = (H - 1) * (H > 1 ? c.head_stride : 0) + (N - 1) * c.token_stride + D;
  std::int64_t span = k_span;
  const std::int64_t v_shift = v_shift_elements(c);
  if (v_shift >= 0 && v_shift < c.page_stride) {  // V lives inside K's pages
    const bool after_k = v_shift >= k_span;
    const bool in_gaps = v_shift >= D && v_shift + D <= inner;
    if (!after_k && !in_gaps) check_rows_disjoint(c, v_shift);
    span = k_span + v_shift;
  }
  MSA_CHECK(c.page_stride >= span, "cache.page_stride = ", c.page_stride, " is smaller than the ",
            span, " elements one page of K and V spans");
}

}  // namespace

void cache_view(const KVCacheView& c) {
  MSA_CHECK(c.num_pages >= 0, "cache.num_pages = ", c.num_pages, " must be >= 0");
  MSA_CHECK(c.num_kv_heads >= 1, "cache.num_kv_heads = ", c.num_kv_heads, " must be >= 1");
  if (c.num_pages > 0) {
    MSA_CHECK(c.k != nullptr, "cache.k is null");
    MSA_CHECK(c.v != nullptr, "cache.v is null");
  }
  switch (c.dtype) {
    case DType::bf16:
    case DType::fp16:
      MSA_CHECK(c.scale_mode == ScaleMode::none, "cache.scale_mode = ",
                scale_mode_name(c.scale_mode), " does not go with a ", dtype_name(c.dtype),
                " cache (expected none)");
      check_strides(c);
      break;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      if (c.scale_mode == ScaleMode::per_tensor) {
        MSA_CHECK(finite_positive(c.k_scale), "cache.k_scale = ", c.k_scale,
                  " must be finite and positive");
        MSA_CHECK(finite_positive(c.v_scale), "cache.v_scale = ", c.v_scale,
                  " must be finite and positive");
      } else if (c.scale_mode == ScaleMode::per_token_head) {
        MSA_CHECK(c.k_scales != nullptr, "cache.k_scales is null but cache.scale_mode = per_token_head");
        MSA_CHECK(c.v_scales != nullptr, "cache.v_scales is null but cache.scale_mode = per_token_head");
      } else {
        fail("cache.scale_mode = ", scale_mode_name(c.scale_mode), " does not go with a ",
             dtype_name(c.dtype), " cache (expected per_tensor or per_token_head)");
      }
      check_strides(c);
      break;
    case DType::nvfp4: {
      MSA_CHECK(c.scale_mode != ScaleMode::per_token_head, "cache.scale_mode = ",
                scale_mode_name(c.scale_mode),
                " does not go with an nvfp4 cache (expected per_tensor: one global scale each for K and V)");
      MSA_CHECK(c.k == c.v, "cache.v differs from cache.k but an nvfp4 cache is one head-slot "
                "allocation (use make_nvfp4_cache_view)");
      const std::int64_t compact = 2 * std::int64_t(c.num_kv_heads) * nvfp4::kSlotBytes;
      MSA_CHECK(c.page_stride >= compact, "cache.page_stride = ", c.page_stride,
                " bytes is smaller than one nvfp4 page (", compact, " bytes for ", c.num_kv_heads,
                " KV heads)");
      MSA_CHECK(finite_positive(c.k_scale), "cache.k_scale = ", c.k_scale,
                " (nvfp4 global scale of K) must be finite and positive");
      MSA_CHECK(finite_positive(c.v_scale), "cache.v_scale = ", c.v_scale,
                " (nvfp4 global scale of V) must be finite and positive");
      break;
    }
    default:
      fail("cache.dtype = ", dtype_name(c.dtype),
           " is not a KV cache dtype (expected bf16, fp16, fp8_e4m3, fp8_e5m2 or nvfp4)");
  }
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
  MSA_CHECK(!fp4 || (std::isfinite(c.global_scale) && c.global_scale > 0.0f), "index_cache.global_scale = ",
            c.global_scale, " must be finite and positive");
}

void insert_kv_shape(const KVCacheView& cache, const InsertKVArgs& args) {
  cache_view(cache);
  MSA_CHECK(args.num_tokens >= 0, "num_tokens = ", args.num_tokens, " must be >= 0");
  MSA_CHECK(is_half(args.src_dtype), "src_dtype = ", dtype_name(args.src_dtype),
            " is not an insert source dtype (expected bf16 or fp16)");
  if (args.num_tokens == 0) return;
  MSA_CHECK(args.k != nullptr, "k is null with num_tokens = ", args.num_tokens);
  MSA_CHECK(args.v != nullptr, "v is null with num_tokens = ", args.num_tokens);
  MSA_CHECK(args.slots != nullptr, "slots is null with num_tokens = ", args.num_tokens);
}

void insert_index_shape(const IndexCacheView& cache, const InsertIndexArgs& args) {
  index_cache_view(cache);
  MSA_CHECK(args.num_tokens >= 0, "num_tokens = ", args.num_tokens, " must be >= 0");
  MSA_CHECK(is_half(args.src_dtype), "src_dtype = ", dtype_name(args.src_dtype),
            " is not an index-key source dtype (expected bf16 or fp16)");
  if (args.num_tokens == 0) return;
  MSA_CHECK(args.index_k != nullptr, "index_k is null with num_tokens = ", args.num_tokens);
  MSA_CHECK(args.slots != nullptr, "slots is null with num_tokens = ", args.num_tokens);
}

void slots_data(const std::int64_t* slots, std::int64_t num_tokens, std::int64_t num_pages,
                const char* what) {
  if (num_tokens <= 0) return;
  MSA_CHECK(slots != nullptr, what, " is null with num_tokens = ", num_tokens);
  const std::int64_t limit = num_pages * kBlockSize;
  for (std::int64_t i = 0; i < num_tokens; ++i) {
    MSA_CHECK(slots[i] < limit, what, "[", i, "] = ", slots[i], " but the cache has ", num_pages,
              " pages (", limit, " slots)");
  }
}

}  // namespace msa::check
