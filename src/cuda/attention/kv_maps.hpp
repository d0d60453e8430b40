// TMA tensor maps of a bf16 / fp16 / fp8 KV cache for the wgmma token-tile
// kernel: one 4-D map per plane (K, V) over the whole page pool, dimension 0
// the 128 head dims and dimensions 1-3 the token-in-page, KV head and page axes
// in ascending stride order. bf16 / fp16: a box is 64 dims x 128 tokens of one
// (page, head), written to shared memory with the 128-byte swizzle. fp8: a box
// is the whole 128 x 128-byte tile, unswizzled (the kernel widens it).
#pragma once

#include <cuda.h>

#include "msa/cache.hpp"

namespace msa::cuda::attention {

struct KvMaps {
  CUtensorMap k;
  CUtensorMap v;
  int token_dim = 1;  // map dimension of the token-in-page axis (1..3)
  int head_dim = 2;   // of the KV-head axis
  int page_dim = 3;   // of the page axis
};

// Encodes the maps of a bf16 / fp16 / fp8 cache; false when the driver cannot (no
// entry point, or a layout the TMA does not take), and the caller falls back
// to the kernels that need no tensor map.
bool make_kv_maps(const KVCacheView& cache, KvMaps& maps);

}  // namespace msa::cuda::attention
