#include "views.hpp"

#include <algorithm>

#include "msa/error.hpp"

namespace msa::py {

namespace {

constexpr std::int64_t N = kBlockSize, D = kHeadDim;

void* byte_shift(void* base, std::int64_t bytes) {
  return static_cast<void*>(static_cast<std::uint8_t*>(base) + bytes);
}

// A stride for a page axis of extent <= 1 that the library accepts whatever the
// framework reported (only page 0 is ever addressed).
std::int64_t page_stride_of(const Array& a, std::int64_t compact) {
  return dim(a, 0) <= 1 ? std::max(a.stride(0), compact) : a.stride(0);
}

const char* packed_layout(std::int64_t H, std::int64_t head_stride, std::int64_t token_stride) {
  if (token_stride == 2 * D && (H == 1 || head_stride == N * 2 * D)) return "hnd";
  if (head_stride == 2 * D && token_stride == H * 2 * D) return "nhd";
  return "strided";
}

KVCacheView nvfp4_view(const KVCacheArgs& a) {
  const Array& c = a.cache;
  expect_shape(c, {-1, -1, N, nvfp4::kDataBytes + nvfp4::kScaleBytes}, "kv_cache",
               "[num_pages, 2 * num_kv_heads, 128, 72] for nvfp4");
  MSA_CHECK(dim(c, 1) >= 2 && dim(c, 1) % 2 == 0, "kv_cache: dimension 1 = ", dim(c, 1),
            " but an nvfp4 page holds 2 * num_kv_heads slots (K and V of each head)");
  const std::int64_t slots = dim(c, 1), tok = nvfp4::kDataBytes + nvfp4::kScaleBytes;
  MSA_CHECK((dim(c, 1) <= 1 || c.stride(1) == nvfp4::kSlotBytes) && c.stride(2) == tok &&
                c.stride(3) == 1,
            "kv_cache: an nvfp4 page must be dense inside (strides (*, ", nvfp4::kSlotBytes, ", ", tok,
            ", 1)) but has (*, ", c.stride(1), ", ", c.stride(2), ", ", c.stride(3), ")");
  MSA_CHECK(!a.k_scales && !a.v_scales, "kv_cache: nvfp4 carries its own group scales; k_scales / "
            "v_scales are for fp8 caches");
  return make_nvfp4_cache_view(data_of(c), dim(c, 0), int(slots / 2), a.k_scale, a.v_scale,
                               page_stride_of(c, slots * nvfp4::kSlotBytes));
}

}  // namespace

KVCacheView kv_cache_view(const KVCacheArgs& a, Placement& where, const char** layout) {
  const Array& c = a.cache;
  where.add(c, "kv_cache");
  const DType dtype = element_dtype(c, a.dtype, "kv_cache");
  MSA_CHECK(is_half(dtype) || is_fp8(dtype) || dtype == DType::nvfp4, "kv_cache: dtype ",
            dtype_name(dtype), " is not a KV cache dtype (bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4)");
  if (dtype == DType::nvfp4) {
    if (layout) *layout = "nvfp4";
    return nvfp4_view(a);
  }
  const auto eb = std::int64_t(dtype_bytes(dtype));
  KVCacheView v;
  v.dtype = dtype;
  v.k = data_of(c);
  v.num_pages = c.ndim() > 0 ? dim(c, 0) : 0;
  if (c.ndim() == 5) {  // [num_pages, 2, 128, num_kv_heads, 128]
    expect_shape(c, {-1, 2, N, -1, D}, "kv_cache", "[num_pages, 2, 128, num_kv_heads, 128] (split K/V planes)");
    expect_inner_contiguous(c, "kv_cache");
    v.num_kv_heads = std::int32_t(dim(c, 3));
    v.v = byte_shift(data_of(c), c.stride(1) * eb);
    v.token_stride = c.stride(2);
    v.head_stride = c.stride(3);
    v.page_stride = page_stride_of(c, 2 * N * v.num_kv_heads * D);
    if (layout) *layout = "split";
  } else {  // [num_pages, num_kv_heads, 128, 256]
    expect_shape(c, {-1, -1, N, 2 * D}, "kv_cache",
                 "[num_pages, num_kv_heads, 128, 256] (K and V in the last dimension) or "
                 "[num_pages, 2, 128, num_kv_heads, 128]");
    expect_inner_contiguous(c, "kv_cache");
    v.num_kv_heads = std::int32_t(dim(c, 1));
    v.v = byte_shift(data_of(c), D * eb);
    v.head_stride = c.stride(1);
    v.token_stride = c.stride(2);
    v.page_stride = page_stride_of(c, v.num_kv_heads * N * 2 * D);
    if (layout) *layout = packed_layout(v.num_kv_heads, v.head_stride, v.token_stride);
  }
  MSA_CHECK(bool(a.k_scales) == bool(a.v_scales), "kv_cache: k_scales and v_scales go together (",
            a.k_scales ? "k_scales" : "v_scales", " given alone)");
  if (a.k_scales) {
    MSA_CHECK(is_fp8(dtype), "k_scales: per-(token, head) scales are for fp8 caches, not ", dtype_name(dtype));
    const std::int64_t rows = v.num_pages * N;
    for (const auto& [s, arg] : {std::pair{&*a.k_scales, "k_scales"}, std::pair{&*a.v_scales, "v_scales"}}) {
      where.add(*s, arg);
      expect_dtype(*s, DType::f32, arg);
      expect_shape(*s, {rows, v.num_kv_heads}, arg, "[num_pages * 128, num_kv_heads]");
      expect_contiguous(*s, arg);
    }
    v.scale_mode = ScaleMode::per_token_head;
    v.k_scales = ptr<float>(*a.k_scales);
    v.v_scales = ptr<float>(*a.v_scales);
  } else {
    v.scale_mode = is_fp8(dtype) ? ScaleMode::per_tensor : ScaleMode::none;
  }
  v.k_scale = a.k_scale;
  v.v_scale = a.v_scale;
  return v;
}

IndexCacheView index_cache_view(const Array& cache, const OptString& dtype, Placement& where) {
  where.add(cache, "index_cache");
  IndexCacheView v;
  v.dtype = element_dtype(cache, dtype, "index_cache");
  expect_shape(cache, {-1, N, D}, "index_cache", "[num_pages, 128, 128]");
  MSA_CHECK(cache.stride(2) == 1 && cache.stride(1) == D, "index_cache: a page must be dense inside",
            " (strides (*, 128, 1)) but has (*, ", cache.stride(1), ", ", cache.stride(2), ")");
  v.base = data_of(cache);
  v.num_pages = dim(cache, 0);
  v.page_stride = page_stride_of(cache, N * D);
  return v;
}

BlockTable block_table_view(const Array& table, const char* arg, Placement& where) {
  where.add(table, arg);
  expect_dtype(table, DType::i32, arg);
  expect_ndim(table, 2, arg, "[num_requests, max_blocks]");
  expect_inner_contiguous(table, arg);
  BlockTable t;
  t.data = ptr<const std::int32_t>(table);
  t.num_rows = std::int32_t(dim(table, 0));
  t.max_blocks = std::int32_t(dim(table, 1));
  t.row_stride = dim(table, 0) <= 1 ? std::max<std::int64_t>(table.stride(0), t.max_blocks) : table.stride(0);
  return t;
}

TopkView topk_view(const Array& topk, const char* arg, Placement& where) {
  where.add(topk, arg);
  expect_dtype(topk, DType::i32, arg);
  expect_ndim(topk, 3, arg, "[num_tokens, num_kv_heads, topk]");
  expect_inner_contiguous(topk, arg);
  TopkView t;
  t.data = ptr<std::int32_t>(topk);
  t.topk = std::int32_t(dim(topk, 2));
  t.token_stride = topk.stride(0);
  t.head_stride = topk.stride(1);
  return t;
}

StepView step_view(const StepArgs& s, Placement& where) {
  const std::pair<const Array*, const char*> arrays[] = {
      {&s.query_start, "query_start"}, {&s.seq_lens, "seq_lens"}, {&s.token_request, "token_request"}};
  for (const auto& [a, arg] : arrays) {
    where.add(*a, arg);
    expect_dtype(*a, DType::i32, arg);
    expect_ndim(*a, 1, arg, "one-dimensional");
    expect_contiguous(*a, arg);
  }
  const std::int64_t R = dim(s.seq_lens, 0);
  MSA_CHECK(dim(s.query_start, 0) == R + 1, "query_start: ", dim(s.query_start, 0),
            " entries but seq_lens has ", R, " requests (query_start needs num_requests + 1)");
  StepView v;
  v.num_requests = std::int32_t(R);
  v.num_tokens = std::int32_t(dim(s.token_request, 0));
  v.num_decodes = s.num_decodes;
  v.decode_query_len = s.decode_query_len;
  v.num_decode_tokens = s.num_decodes * s.decode_query_len;
  v.query_start = ptr<const std::int32_t>(s.query_start);
  v.seq_lens = ptr<const std::int32_t>(s.seq_lens);
  v.token_request = ptr<const std::int32_t>(s.token_request);
  return v;
}

}  // namespace msa::py
