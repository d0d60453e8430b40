// Host encoding of the KV tensor maps and of the query / output rows' maps
// (kv_maps.hpp) through the driver entry point cuTensorMapEncodeTiled, fetched once from the runtime (no libcuda link).
#include "cuda/attention/host/kv_maps.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "cuda/common/tensor_map.hpp"
#include "msa/dtype.hpp"

namespace msa::cuda::attention {
namespace {

// A 3-D map of 16-bit rows [num_tokens, num_q_heads, 128]: boxes of 64 dims x
// `group` heads x `box_tokens` tokens (64 / group: a warpgroup's 64 rows),
// 128-byte swizzle (make_query_map).
bool make_rows_map(const void* rows, DType dtype, std::int64_t num_tokens, int num_q_heads, int group,
                   CUtensorMap& map, int box_tokens = 0) {
  if (dtype != DType::bf16 && dtype != DType::fp16) return false;
  if (rows == nullptr || num_tokens <= 0 || num_q_heads <= 0 || group <= 0 || 64 % group != 0) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const std::int64_t row_bytes = std::int64_t(kHeadDim) * 2;  // one query head's 128 dims
  const cuuint64_t dims[3] = {cuuint64_t(kHeadDim), cuuint64_t(num_q_heads), cuuint64_t(num_tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(row_bytes), cuuint64_t(row_bytes * num_q_heads)};
  const cuuint32_t box[3] = {64u, cuuint32_t(group), cuuint32_t(box_tokens > 0 ? box_tokens : 64 / group)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type =
      dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r = encode(&map, type, 3, const_cast<void*>(rows), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace

bool tensor_maps_available() { return tensor_map_encoder() != nullptr; }

bool make_kv_maps(const KVCacheView& c, KvMaps& maps) {
  const bool half = c.dtype == DType::bf16 || c.dtype == DType::fp16;
  if (!half && !is_fp8(c.dtype)) return false;
  const std::int64_t eb = half ? 2 : 1;  // element bytes
  if (c.num_pages <= 0 || c.num_kv_heads <= 0 || c.k == nullptr || c.v == nullptr) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  // Axes 1-3 (token, head, page) in ascending stride order.
  struct Axis {
    int which;  // 0 token, 1 head, 2 page
    std::int64_t extent;
    std::int64_t stride_bytes;
  };
  std::array<Axis, 3> axes = {Axis{0, kBlockSize, c.token_stride * eb}, Axis{1, c.num_kv_heads, c.head_stride * eb},
                              Axis{2, c.num_pages, c.page_stride * eb}};
  std::stable_sort(axes.begin(), axes.end(),
                   [](const Axis& a, const Axis& b) { return a.stride_bytes < b.stride_bytes; });
  cuuint64_t dims[4] = {128, 0, 0, 0};
  cuuint64_t strides[3] = {};
  cuuint32_t box[4] = {half ? 64u : 128u, 1, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  for (int i = 0; i < 3; ++i) {
    const Axis& a = axes[std::size_t(i)];
    if (a.stride_bytes <= 0 || a.stride_bytes % 16 != 0 || a.stride_bytes >= (std::int64_t(1) << 40)) return false;
    dims[i + 1] = cuuint64_t(a.extent);
    strides[i] = cuuint64_t(a.stride_bytes);
    if (a.which == 0) {
      box[i + 1] = kBlockSize;
      maps.token_dim = i + 1;
    } else if (a.which == 1) {
      maps.head_dim = i + 1;
    } else {
      maps.page_dim = i + 1;
    }
  }
  const CUtensorMapDataType type = c.dtype == DType::bf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : c.dtype == DType::fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUtensorMapSwizzle swizzle = half ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
  for (int plane = 0; plane < 2; ++plane) {
    const CUresult r = encode(plane == 0 ? &maps.k : &maps.v, type, 4, plane == 0 ? c.k : c.v, dims, strides, box,
                              element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return false;
  }
  return true;
}

bool make_query_map(const void* q, DType q_dtype, std::int64_t num_tokens, int num_q_heads, int group,
                    KvMaps& maps) {
  if (q_dtype != DType::bf16 && q_dtype != DType::fp16) return true;
  maps.has_q_token = group >= 8 && make_rows_map(q, q_dtype, num_tokens, num_q_heads, group, maps.q_token, 1) ? 1 : 0;
  return make_rows_map(q, q_dtype, num_tokens, num_q_heads, group, maps.q);
}

void make_output_map(void* out, DType out_dtype, std::int64_t num_tokens, int num_q_heads, int group, KvMaps& maps) {
  maps.has_out = make_rows_map(out, out_dtype, num_tokens, num_q_heads, group, maps.out) ? 1 : 0;
}

void make_partials_map(void* partials, DType dtype, std::int64_t rows, int num_q_heads, int group, KvMaps& maps) {
  maps.has_partials =
      group >= 8 && make_rows_map(partials, dtype, rows, num_q_heads, group, maps.partials, 1) ? 1 : 0;
}

}  // namespace msa::cuda::attention
