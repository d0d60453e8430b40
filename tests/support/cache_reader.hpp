// Reads what the caches and inputs hold, as float64, for the oracle. Written
// apart from the engines: it uses only the scalar decoders of msa/numeric.hpp,
// the view's offset functions and the contract's formulas (fp8: stored * scale;
// nvfp4: e2m1(code) * e4m3(group scale) * global scale, contracts 4.2 and 4.3).
#pragma once

#include <cstdint>
#include <vector>

#include "msa/cache.hpp"
#include "msa/dtype.hpp"
#include "msa/ops.hpp"

namespace msa::ref {

// Element i of an array of bf16, fp16, fp8 e4m3 / e5m2 or f32, as double.
double read_element(const void* data, DType dtype, std::int64_t i);
// n elements times `scale`.   data: [n]
std::vector<double> read_array(const void* data, DType dtype, std::int64_t n, double scale = 1.0);

// The query of an attention call as double: bf16 / fp16 as stored, fp8 e4m3 as
// stored * q_scale.   returns [num_tokens, num_q_heads, 128]
std::vector<double> read_query(const AttentionArgs& args, std::int64_t num_tokens);

// Dequantized K and V of request r, KV head `head`, logical positions
// [0, seq_len): position j lives in page table.at(r, j / 128), token j % 128.
//   k, v: [seq_len, 128]
void read_kv(const KVCacheView& cache, const BlockTable& table, std::int32_t r, std::int32_t head,
             std::int64_t seq_len, double* k, double* v);

// Dequantized K and V of one (page, KV head, token) row.
//   k, v: [128]
void read_kv_row(const KVCacheView& cache, std::int64_t page, std::int32_t head, std::int64_t token, double* k,
                 double* v);

// The index key in (page, token) of an index cache, dequantized: bf16 / fp8 as
// stored, nvfp4 as e2m1(code) * e4m3(group scale) * global_scale (contract 4.2).
//   out: [128]
void read_index_row(const IndexCacheView& cache, std::int64_t page, std::int64_t token, double* out);

struct HeadKV {
  std::vector<double> k;  // [seq_len, 128]
  std::vector<double> v;  // [seq_len, 128]
};
HeadKV read_kv(const KVCacheView& cache, const BlockTable& table, std::int32_t r,
               std::int32_t head, std::int64_t seq_len);

}  // namespace msa::ref
