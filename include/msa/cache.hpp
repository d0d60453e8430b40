// Views of the paged caches. A view is a few pointers and explicit 64-bit
// strides; one inline function per cache turns (page, head, token, feature)
// into an element offset, shared by the CPU engine and the CUDA kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "msa/common.hpp"
#include "msa/dtype.hpp"

namespace msa {

// How fp8 cache values are scaled (read value = stored * scale).
enum class ScaleMode : std::uint8_t {
  none,            // bf16 / fp16 caches
  per_tensor,      // one float for K and one for V
  per_token_head,  // one float per (physical token slot, KV head), K and V each
};

// Physical order of a packed bf16/fp16/fp8 page.
enum class Layout : std::uint8_t {
  hnd,    // [page][head][token][256]   (default)
  nhd,    // [page][token][head][256]
  split,  // [page][2][token][head][128], K = plane 0, V = plane 1
};
const char* layout_name(Layout l);
Layout parse_layout(const char* name, const char* argument = "layout");

// ---- main cache, bf16 / fp16 / fp8 ----------------------------------------
//  K element (page, head, token, d) is at k[page*page_stride + head*head_stride
//  + token*token_stride + d], V likewise from v; d in [0, 128) is contiguous.
//  nvfp4 uses the same struct with the byte-addressed head-slot page (below).
struct KVCacheView {
  DType dtype = DType::bf16;  // bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4
  void* k = nullptr;          // K base (nvfp4: byte base of page 0)
  void* v = nullptr;          // V base (nvfp4: same as k)
  std::int64_t num_pages = 0;
  std::int32_t num_kv_heads = 0;
  std::int64_t page_stride = 0;   // elements (nvfp4: bytes); may exceed one page
  std::int64_t head_stride = 0;   // elements (nvfp4: unused)
  std::int64_t token_stride = 0;  // elements (nvfp4: unused)
  ScaleMode scale_mode = ScaleMode::none;
  float k_scale = 1.0f;  // per_tensor fp8 scale; nvfp4 global dequant scale of K
  float v_scale = 1.0f;  // per_tensor fp8 scale; nvfp4 global dequant scale of V
  float* k_scales = nullptr;  // per_token_head: [num_pages * 128, num_kv_heads]
  float* v_scales = nullptr;  // per_token_head: [num_pages * 128, num_kv_heads]

  MSA_HD std::int64_t offset(std::int64_t page, std::int64_t head, std::int64_t token,
                             std::int64_t d) const {
    return page * page_stride + head * head_stride + token * token_stride + d;
  }
  // Index of a (slot, head) in the per_token_head scale arrays.
  MSA_HD std::int64_t scale_index(std::int64_t page, std::int64_t head, std::int64_t token) const {
    return (page * kBlockSize + token) * num_kv_heads + head;
  }
};

// ---- nvfp4 head-slot page (contract 4.3) -----------------------------------
// One page: [2 * num_kv_heads slots][128 tokens][72 bytes]; slot 2h is head h's
// K, 2h+1 its V. Inside a slot: 128 x 64 data bytes, then 128 x 8 scale bytes.
namespace nvfp4 {
inline constexpr std::int64_t kDataBytes = 64;    // per token: 128 e2m1 codes
inline constexpr std::int64_t kScaleBytes = 8;    // per token: 8 e4m3 group scales
inline constexpr std::int64_t kSlotBytes = kBlockSize * (kDataBytes + kScaleBytes);  // 9216
inline constexpr int kGroup = 16;
// Byte offset of the slot (page, head, is_v) from the cache base.
MSA_HD std::int64_t slot_offset(const KVCacheView& c, std::int64_t page, std::int64_t head, int is_v) {
  return page * c.page_stride + (2 * head + is_v) * kSlotBytes;
}
// Byte offset of data byte i (elements 2i, 2i+1) of a token inside its slot.
MSA_HD std::int64_t data_offset(std::int64_t token, std::int64_t i) { return token * kDataBytes + i; }
// Byte offset of group scale g (elements 16g..16g+15) of a token inside its slot.
MSA_HD std::int64_t scale_offset(std::int64_t token, std::int64_t g) {
  return kBlockSize * kDataBytes + token * kScaleBytes + g;
}
}  // namespace nvfp4

// Bytes of one compact page for one KV head (K and V): 65,536 for bf16,
// 32,768 for fp8, 18,432 for nvfp4.
std::int64_t page_bytes_per_head(DType dtype);

// Builders for the common physical orders. `page_stride` 0 means compact;
// a larger value (elements, bytes for nvfp4) covers layer- or block-outer packing.
KVCacheView make_cache_view(DType dtype, void* base, std::int64_t num_pages, int num_kv_heads,
                            Layout layout, std::int64_t page_stride = 0);
KVCacheView make_nvfp4_cache_view(void* base, std::int64_t num_pages, int num_kv_heads,
                                  float k_global_scale, float v_global_scale,
                                  std::int64_t page_stride_bytes = 0);
// Elements (bytes for nvfp4) a cache of this shape spans from its base.
std::int64_t cache_extent(const KVCacheView& c);

// ---- index cache (contract 4.2) ------------------------------------------------
// bf16 / fp8 e4m3 (plain saturating cast, no scale): [num_pages][128 tokens][128],
// page_stride in elements. nvfp4: [num_pages][128 tokens][72 bytes] (per token 64
// data bytes, then 8 e4m3 group scales; index_nvfp4 below), page_stride in bytes,
// values e2m1(code) * group scale * global_scale.
struct IndexCacheView {
  DType dtype = DType::bf16;
  void* base = nullptr;
  std::int64_t num_pages = 0;
  std::int64_t page_stride = std::int64_t(kBlockSize) * kHeadDim;  // elements (nvfp4: bytes)
  float global_scale = 1.0f;  // nvfp4 only: the cache's dequant scale

  // Element offset of feature d of a token (bf16 / fp8 only).
  MSA_HD std::int64_t offset(std::int64_t page, std::int64_t token, std::int64_t d) const {
    return page * page_stride + token * kHeadDim + d;
  }
};

// The nvfp4 index page: one 72-byte row per token.
namespace index_nvfp4 {
inline constexpr std::int64_t kDataBytes = 64;   // per token: 128 e2m1 codes, element 2i in the low nibble of byte i
inline constexpr std::int64_t kScaleBytes = 8;   // per token: the e4m3 scale of elements 16g .. 16g + 15 at byte g
inline constexpr std::int64_t kRowBytes = kDataBytes + kScaleBytes;  // 72
inline constexpr std::int64_t kPageBytes = kBlockSize * kRowBytes;   // 9,216
// Byte offset of a token's row from the cache base.
MSA_HD std::int64_t row_offset(const IndexCacheView& c, std::int64_t page, std::int64_t token) {
  return page * c.page_stride + token * kRowBytes;
}
}  // namespace index_nvfp4

// Bytes of one compact index page: 32,768 (bf16), 16,384 (fp8), 9,216 (nvfp4).
std::int64_t index_page_bytes(DType dtype);

// An index cache view; `page_stride` 0 means compact (elements for bf16 / fp8,
// bytes for nvfp4); `global_scale` is the nvfp4 dequant scale.
IndexCacheView make_index_cache_view(DType dtype, void* base, std::int64_t num_pages,
                                     std::int64_t page_stride = 0, float global_scale = 1.0f);

// ---- block table ----------------------------------------------------------------
// Row r, column b: the physical page of request r's logical block b.
struct BlockTable {
  const std::int32_t* data = nullptr;  // [num_rows, row_stride]
  std::int32_t num_rows = 0;
  std::int32_t max_blocks = 0;         // columns in use per row
  std::int64_t row_stride = 0;         // elements between rows

  MSA_HD std::int32_t at(std::int64_t r, std::int64_t b) const { return data[r * row_stride + b]; }
};

}  // namespace msa
