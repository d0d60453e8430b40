// Cache allocation helpers: the shapes and strides (in elements; bytes for
// nvfp4) of the KV cache in each layout and of the index cache, from the
// library's own view builders, and the view msa reads from a given array.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "msa/cache.hpp"
#include "msa/error.hpp"
#include "views.hpp"

namespace msa::py {

namespace {

nb::tuple int_tuple(std::initializer_list<std::int64_t> v) {
  nb::list l;
  for (const std::int64_t x : v) l.append(x);
  return nb::tuple(l);
}

// The logical shape an array of the cache has (views.hpp) and its strides.
nb::dict kv_cache_geometry(std::int64_t num_pages, int num_kv_heads, const std::string& kv_dtype,
                           const std::string& layout, std::int64_t page_stride) {
  const DType dtype = parse_dtype(kv_dtype, "kv_dtype");
  nb::dict d;
  const std::int64_t P = num_pages, H = num_kv_heads, N = kBlockSize, D = kHeadDim;
  if (dtype == DType::nvfp4) {
    const KVCacheView c = make_nvfp4_cache_view(nullptr, P, num_kv_heads, 1.0f, 1.0f, page_stride);
    const std::int64_t tok = nvfp4::kDataBytes + nvfp4::kScaleBytes;
    d["shape"] = int_tuple({P, 2 * H, N, tok});
    d["strides"] = int_tuple({c.page_stride, nvfp4::kSlotBytes, tok, 1});
    d["extent"] = cache_extent(c);
    d["layout"] = "nvfp4";
    d["storage"] = "uint8";
    return d;
  }
  const Layout l = parse_layout(layout.c_str(), "layout");
  const KVCacheView c = make_cache_view(dtype, nullptr, P, num_kv_heads, l, page_stride);
  if (l == Layout::split) {
    const std::int64_t v_shift = reinterpret_cast<std::intptr_t>(c.v) / std::int64_t(dtype_bytes(dtype));
    d["shape"] = int_tuple({P, 2, N, H, D});
    d["strides"] = int_tuple({c.page_stride, v_shift, c.token_stride, c.head_stride, 1});
  } else {
    d["shape"] = int_tuple({P, H, N, 2 * D});
    d["strides"] = int_tuple({c.page_stride, c.head_stride, c.token_stride, 1});
  }
  d["extent"] = cache_extent(c);
  d["layout"] = layout_name(l);
  d["storage"] = dtype_bytes(dtype) == 2 ? dtype_name(dtype) : "uint8";
  return d;
}

nb::dict index_cache_geometry(std::int64_t num_pages, std::int64_t page_stride) {
  const std::int64_t N = kBlockSize, D = kHeadDim;
  page_stride = make_index_cache_view(DType::bf16, nullptr, num_pages, page_stride).page_stride;
  constexpr std::int64_t kMaxElements = std::int64_t(1) << 62;
  MSA_CHECK(num_pages <= 1 || num_pages - 1 <= (kMaxElements - N * D) / page_stride, "num_pages = ", num_pages,
            " pages ", page_stride, " elements apart span more than 2^62 elements");
  nb::dict d;
  d["shape"] = int_tuple({num_pages, N, D});
  d["strides"] = int_tuple({page_stride, D, 1});
  d["extent"] = num_pages == 0 ? 0 : (num_pages - 1) * page_stride + N * D;
  return d;
}

const char* scale_mode_name(ScaleMode m) {
  switch (m) {
    case ScaleMode::none: return "none";
    case ScaleMode::per_tensor: return "per_tensor";
    case ScaleMode::per_token_head: return "per_token_head";
  }
  return "unknown";
}

// The KVCacheView msa builds from an array (what insert_kv and attend read).
nb::dict describe_kv_cache(const KVCacheArgs& a) {
  Placement where;
  const char* layout = "";
  const KVCacheView c = kv_cache_view(a, where, &layout);
  nb::dict d;
  d["dtype"] = dtype_name(c.dtype);
  d["layout"] = layout;
  d["num_pages"] = c.num_pages;
  d["num_kv_heads"] = c.num_kv_heads;
  d["page_stride"] = c.page_stride;
  d["head_stride"] = c.head_stride;
  d["token_stride"] = c.token_stride;
  d["v_offset_bytes"] = reinterpret_cast<std::intptr_t>(c.v) - reinterpret_cast<std::intptr_t>(c.k);
  d["scale_mode"] = scale_mode_name(c.scale_mode);
  d["device"] = where.cuda() ? "cuda:" + std::to_string(where.device()) : std::string("cpu");
  return d;
}

}  // namespace

void bind_caches(nb::module_& m) {
  using namespace nb::literals;
  m.def("kv_cache_geometry", &kv_cache_geometry, "num_pages"_a, "num_kv_heads"_a, "kv_dtype"_a = "bf16",
        "layout"_a = "hnd", "page_stride"_a = 0,
        "Shape, strides (elements; bytes for nvfp4), extent and storage dtype of a KV cache array in a "
        "layout (hnd, nhd, split; nvfp4 has its head-slot pages). page_stride 0: compact pages.");
  m.def("index_cache_geometry", &index_cache_geometry, "num_pages"_a, "page_stride"_a = 0,
        "Shape, strides and extent (elements) of an index cache [num_pages, 128, 128].");
  m.def(
      "describe_kv_cache",
      [](const Array& kv_cache, const OptString& kv_dtype, float k_scale, float v_scale, const OptArray& k_scales,
         const OptArray& v_scales) {
        return describe_kv_cache(KVCacheArgs{kv_cache, kv_dtype, k_scale, v_scale, k_scales, v_scales});
      },
      "kv_cache"_a, nb::kw_only(), "kv_dtype"_a = nb::none(), "k_scale"_a = 1.0f, "v_scale"_a = 1.0f,
      "k_scales"_a = nb::none(), "v_scales"_a = nb::none(),
      "The cache view msa reads from this array: dtype, layout, strides, scale mode.");
}

}  // namespace msa::py
