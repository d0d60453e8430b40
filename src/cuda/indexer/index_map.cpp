#include "cuda/indexer/index_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "cuda/common/tensor_map.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"

namespace msa::cuda::indexer {
namespace {

CUtensorMapDataType map_type(DType dtype) {
  return dtype == DType::bf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
         : dtype == DType::fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                : CU_TENSOR_MAP_DATA_TYPE_UINT8;
}

}  // namespace

int index_box_features(DType dtype) { return dtype_bytes(dtype) == 2 ? 64 : 128; }

bool make_index_map(const IndexCacheView& c, CUtensorMap& map) {
  if (c.dtype != DType::bf16 && c.dtype != DType::fp16 && c.dtype != DType::fp8_e4m3) return false;
  if (c.base == nullptr || c.num_pages <= 0) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const std::int64_t eb = std::int64_t(dtype_bytes(c.dtype));
  const std::int64_t page_bytes = c.page_stride * eb;
  if (page_bytes <= 0 || page_bytes % 16 != 0 || page_bytes >= (std::int64_t(1) << 40)) return false;
  const cuuint64_t dims[3] = {cuuint64_t(kHeadDim), cuuint64_t(kBlockSize), cuuint64_t(c.num_pages)};
  const cuuint64_t strides[2] = {cuuint64_t(kHeadDim * eb), cuuint64_t(page_bytes)};
  const cuuint32_t box[3] = {cuuint32_t(index_box_features(c.dtype)), cuuint32_t(kBlockSize), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(&map, map_type(c.dtype), 3, c.base, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool make_rows_map(const void* rows, DType dtype, std::int64_t num_rows, int box_rows, CUtensorMap& map) {
  if (dtype != DType::bf16 && dtype != DType::fp16 && dtype != DType::fp8_e4m3) return false;
  if (rows == nullptr || num_rows <= 0 || box_rows <= 0 || box_rows > 256) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const std::int64_t eb = std::int64_t(dtype_bytes(dtype));
  const cuuint64_t dims[2] = {cuuint64_t(kHeadDim), cuuint64_t(num_rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kHeadDim * eb)};
  const cuuint32_t box[2] = {cuuint32_t(128 / eb), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(&map, map_type(dtype), 2, const_cast<void*>(rows), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace msa::cuda::indexer
