#include "msa/cache.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/view_span.hpp"
#include "msa/error.hpp"

namespace msa {

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::hnd: return "hnd";
    case Layout::nhd: return "nhd";
    case Layout::split: return "split";
  }
  return "unknown";
}

Layout parse_layout(const char* name, const char* argument) {
  if (!std::strcmp(name, "hnd") || !std::strcmp(name, "HND")) return Layout::hnd;
  if (!std::strcmp(name, "nhd") || !std::strcmp(name, "NHD")) return Layout::nhd;
  if (!std::strcmp(name, "split")) return Layout::split;
  fail(argument, " = '", name, "' is not a layout (expected hnd, nhd or split)");
}

std::int64_t page_bytes_per_head(DType dtype) {
  if (dtype == DType::nvfp4) return 2 * nvfp4::kSlotBytes;
  const auto b = std::int64_t(dtype_bytes(dtype));
  MSA_CHECK(b == 1 || b == 2, "cache dtype = ", dtype_name(dtype), " is not a KV cache dtype");
  return 2 * kBlockSize * kHeadDim * b;
}

KVCacheView make_cache_view(DType dtype, void* base, std::int64_t num_pages, int num_kv_heads,
                            Layout layout, std::int64_t page_stride) {
  MSA_CHECK(dtype == DType::bf16 || dtype == DType::fp16 || is_fp8(dtype), "cache dtype = ",
            dtype_name(dtype), " needs make_nvfp4_cache_view or is not a KV cache dtype");
  MSA_CHECK(num_pages >= 0, "num_pages = ", num_pages, " must be >= 0");
  MSA_CHECK(num_kv_heads >= 1, "num_kv_heads = ", num_kv_heads, " must be >= 1");
  const std::int64_t H = num_kv_heads, N = kBlockSize, D = kHeadDim;
  const std::int64_t compact = H * N * 2 * D;
  if (page_stride == 0) page_stride = compact;
  MSA_CHECK(page_stride >= compact, "page_stride = ", page_stride,
            " is smaller than one page (", compact, " elements)");
  check::size_of("the cache", check::size_of("the cache", num_pages, page_stride), std::int64_t(dtype_bytes(dtype)));
  KVCacheView c;
  c.dtype = dtype;
  c.num_pages = num_pages;
  c.num_kv_heads = num_kv_heads;
  c.page_stride = page_stride;
  const auto eb = std::int64_t(dtype_bytes(dtype));
  // V's base as an address, so that a view built on a null base (to size an
  // allocation with cache_extent) still records where V starts.
  const auto at = [base](std::int64_t byte_offset) {
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(base) + std::uintptr_t(byte_offset));
  };
  c.k = base;
  switch (layout) {
    case Layout::hnd:
      c.head_stride = N * 2 * D;
      c.token_stride = 2 * D;
      c.v = at(D * eb);
      break;
    case Layout::nhd:
      c.head_stride = 2 * D;
      c.token_stride = H * 2 * D;
      c.v = at(D * eb);
      break;
    case Layout::split:
      c.head_stride = D;
      c.token_stride = H * D;
      c.v = at(N * H * D * eb);
      break;
    default:
      fail("layout = ", int(layout), " is not a layout (expected hnd, nhd or split)");
  }
  c.scale_mode = is_fp8(dtype) ? ScaleMode::per_tensor : ScaleMode::none;
  return c;
}

KVCacheView make_nvfp4_cache_view(void* base, std::int64_t num_pages, int num_kv_heads,
                                  float k_global_scale, float v_global_scale,
                                  std::int64_t page_stride_bytes) {
  MSA_CHECK(num_pages >= 0, "num_pages = ", num_pages, " must be >= 0");
  MSA_CHECK(num_kv_heads >= 1, "num_kv_heads = ", num_kv_heads, " must be >= 1");
  const std::int64_t compact = 2 * std::int64_t(num_kv_heads) * nvfp4::kSlotBytes;
  if (page_stride_bytes == 0) page_stride_bytes = compact;
  MSA_CHECK(page_stride_bytes >= compact, "page_stride = ", page_stride_bytes,
            " bytes is smaller than one nvfp4 page (", compact, " bytes)");
  check::size_of("the cache", num_pages, page_stride_bytes);
  MSA_CHECK(std::isfinite(k_global_scale) && k_global_scale > 0.0f, "k_global_scale = ",
            k_global_scale, " must be finite and positive");
  MSA_CHECK(std::isfinite(v_global_scale) && v_global_scale > 0.0f, "v_global_scale = ",
            v_global_scale, " must be finite and positive");
  KVCacheView c;
  c.dtype = DType::nvfp4;
  c.k = base;
  c.v = base;
  c.num_pages = num_pages;
  c.num_kv_heads = num_kv_heads;
  c.page_stride = page_stride_bytes;
  c.scale_mode = ScaleMode::per_tensor;
  c.k_scale = k_global_scale;
  c.v_scale = v_global_scale;
  return c;
}

std::int64_t index_page_bytes(DType dtype) {
  if (dtype == DType::nvfp4) return index_nvfp4::kPageBytes;
  MSA_CHECK(dtype == DType::bf16 || dtype == DType::fp8_e4m3, "index cache dtype = ", dtype_name(dtype),
            " is not an index cache dtype (expected bf16, fp8_e4m3 or nvfp4)");
  return std::int64_t(kBlockSize) * kHeadDim * std::int64_t(dtype_bytes(dtype));
}

IndexCacheView make_index_cache_view(DType dtype, void* base, std::int64_t num_pages, std::int64_t page_stride,
                                     float global_scale) {
  const std::int64_t page_bytes = index_page_bytes(dtype);
  MSA_CHECK(num_pages >= 0, "num_pages = ", num_pages, " must be >= 0");
  MSA_CHECK(std::isfinite(global_scale) && global_scale > 0.0f, "global_scale = ", global_scale,
            " must be finite and positive");
  // Compact stride in the unit of page_stride: bytes for nvfp4, elements otherwise.
  const std::int64_t compact = dtype == DType::nvfp4 ? page_bytes : std::int64_t(kBlockSize) * kHeadDim;
  if (page_stride == 0) page_stride = compact;
  MSA_CHECK(page_stride >= compact, "page_stride = ", page_stride, " is smaller than one index page (",
            compact, dtype == DType::nvfp4 ? " bytes)" : " elements)");
  IndexCacheView c;
  c.dtype = dtype;
  c.base = base;
  c.num_pages = num_pages;
  c.page_stride = page_stride;
  c.global_scale = global_scale;
  return c;
}

std::int64_t cache_extent(const KVCacheView& c) {
  if (c.num_pages == 0) return 0;
  if (c.dtype == DType::nvfp4) return (c.num_pages - 1) * c.page_stride + 2 * std::int64_t(c.num_kv_heads) * nvfp4::kSlotBytes;
  // The largest offset touched by K or V, plus one, measured from c.k.
  const std::int64_t last = c.offset(c.num_pages - 1, c.num_kv_heads - 1, kBlockSize - 1, kHeadDim - 1);
  const std::int64_t eb = std::int64_t(dtype_bytes(c.dtype));
  // V's distance from K in elements (as addresses: K and V may be separate allocations).
  const std::int64_t v_shift =
      (std::int64_t(reinterpret_cast<std::uintptr_t>(c.v)) - std::int64_t(reinterpret_cast<std::uintptr_t>(c.k))) / eb;
  return last + 1 + (v_shift > 0 ? v_shift : 0);
}

}  // namespace msa
