// TMA tensor map of a bf16 / fp8 index cache (contract 4.2), or of nvfp4 keys
// widened to bf16 / fp16 pages (widen_keys.hpp), encoded on the host through
// the driver entry point cuTensorMapEncodeTiled (no libcuda link).
//
// The map is 3-D: dimension 0 the 128 features, 1 the 128 tokens of a page, 2
// the pages (their 64-bit page stride). A box is one page's 128 tokens by 64
// bf16 features or by all 128 fp8 features: 128-byte rows, written to shared
// memory with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r & 7)),
// the layout ldmatrix and wgmma read without bank conflicts.
#pragma once

#include <cuda.h>

#include "msa/cache.hpp"

namespace msa::cuda::indexer {

// Elements of one box along the feature axis: 64 (bf16, fp16) or 128 (fp8).
int index_box_features(DType dtype);

// Encodes the map of a bf16 / fp16 / fp8 e4m3 index cache (fp16: widened keys
// only); false when the driver cannot (no entry point, or strides the TMA does
// not take).
bool make_index_map(const IndexCacheView& cache, CUtensorMap& map);

// Encodes a 2-D map over rows [num_rows, 128] of 16-bit (bf16, fp16) or 8-bit (e4m3)
// elements, boxes of `box_rows` rows by 128 bytes, 128-byte swizzle: the index
// queries of a prefill tile. false when the driver cannot.
bool make_rows_map(const void* rows, DType dtype, std::int64_t num_rows, int box_rows, CUtensorMap& map);

}  // namespace msa::cuda::indexer
