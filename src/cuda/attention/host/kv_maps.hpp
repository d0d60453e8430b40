// TMA tensor maps of a bf16 / fp16 / fp8 KV cache for the wgmma token-tile
// kernel: one 4-D map per plane (K, V) over the whole page pool, dimension 0
// the 128 head dims and dimensions 1-3 the token-in-page, KV head and page axes
// in ascending stride order. bf16 / fp16: a box is 64 dims x 128 tokens of one
// (page, head), written to shared memory with the 128-byte swizzle. fp8: a box
// is the whole 128 x 128-byte tile, unswizzled (the kernel widens it).
// The same struct carries the maps of the step's query rows (make_query_map),
// through which the kernel loads a CTA's first tile of rows (the key-major
// kernel: each item's tokens), and of its output
// rows (make_output_map), through which it stores whole warpgroups of rows.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "msa/cache.hpp"
#include "msa/dtype.hpp"

namespace msa::cuda::attention {

struct KvMaps {
  CUtensorMap k;
  CUtensorMap v;
  int token_dim = 1;  // map dimension of the token-in-page axis (1..3)
  int head_dim = 2;   // of the KV-head axis
  int page_dim = 3;   // of the page axis
  CUtensorMap q;      // the query rows (make_query_map)
  CUtensorMap out;    // the output rows (make_output_map), when has_out
  int has_out = 0;
  CUtensorMap q_token;  // the query rows a token at a time (make_query_map), when has_q_token
  int has_q_token = 0;
  CUtensorMap partials;  // the key-major partials (make_partials_map), when has_partials
  int has_partials = 0;
};

// Whether the driver offers the entry point that encodes tensor maps (the
// wgmma tiles load through them; without it they do not run).
bool tensor_maps_available();

// Encodes the maps of a bf16 / fp16 / fp8 cache; false when the driver cannot (no
// entry point, or a layout the TMA does not take), and the caller falls back
// to the kernels that need no tensor map.
bool make_kv_maps(const KVCacheView& cache, KvMaps& maps);

// Encodes maps.q over a bf16 / fp16 query [num_tokens, num_q_heads, 128]
// (16-byte aligned): 3-D, dimension 0 the head dims, 1 the query heads, 2 the
// tokens; a box is 64 dims x `group` heads (one KV head's) x 64 / group tokens,
// i.e. 64 tile rows (token-major), written to shared memory with the 128-byte
// swizzle, as wgmma reads a warpgroup's half of the Q tile. True when done or
// not needed (fp8 queries, which the kernel converts); false when a bf16 /
// fp16 query cannot be mapped (a group that does not divide 64, or a driver
// that cannot encode it): the wgmma tiles then do not run, since they load
// such a query's first tile through the map. Also encodes maps.q_token, boxes
// of one token (64 dims x `group` heads), when group >= 8 (a box is then whole
// 1 KiB swizzle atoms), and sets maps.has_q_token: the key-major kernel
// gathers its items' tokens through it.
bool make_query_map(const void* q, DType q_dtype, std::int64_t num_tokens, int num_q_heads, int group,
                    KvMaps& maps);

// Encodes maps.out over a bf16 / fp16 output [num_tokens, num_q_heads, 128]
// (16-byte aligned) as make_query_map does the query, and sets maps.has_out:
// the kernel then stores a warpgroup's 64 staged rows (in the Q buffer's
// swizzled layout) as two boxes. When it cannot be encoded, has_out stays 0
// and the kernel writes the rows with its own stores.
void make_output_map(void* out, DType out_dtype, std::int64_t num_tokens, int num_q_heads, int group, KvMaps& maps);

// Encodes maps.partials over the key-major partials [tokens x topk, num_q_heads,
// 128] (16-bit, 16-byte aligned) as maps.q_token is the query (boxes of 64
// dims x `group` heads of one (token, slot)), when group >= 8, and sets
// maps.has_partials: the key-major kernel then stores a token's staged rows
// by TMA; otherwise it copies them.
void make_partials_map(void* partials, DType dtype, std::int64_t rows, int num_q_heads, int group, KvMaps& maps);

}  // namespace msa::cuda::attention
