// `msa bench --set pre_attention`: the cases and the byte accounting of the
// fused pre-attention step (pure host functions, unit-tested in
// tests/unit/test_pre_attention_bench.cpp). A case is BenchCase with op
// pre_attention: `batch` tokens of one step, num_q_heads / num_kv_heads per
// rank (niq = nkv), the KV cache dtype in `dtype`; qkv, q, index q and the
// index cache are bf16, the weights and the cos/sin table fp32.
//
// Bytes per token, read + written once each:
//   read   qkv row (nq + 2 nkv + niq + 1) x 128 x 2, position 8, slot 8, cos/sin row 64 x 4
//   write  q nq x 128 x 2, index q niq x 128 x 2, index key 128 x 2,
//          K and V per KV head: 2 x 128 x dtype bytes (+ 2 x 4 of per-token fp8
//          scales), nvfp4 2 x 72
// plus the four norm weights once (4 x 128 x 4).
#pragma once

#include <cstdint>
#include <vector>

#include "bench_accounting.hpp"
#include "msa/cache.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"
#include "msa/pre_attention.hpp"

namespace msa::tool {

// Step sizes of the set: one decode token up to a 32K-token prefill chunk.
inline constexpr std::int32_t kPreAttentionTokens[] = {1, 8, 64, 512, 4096, 16384, 32768};

// Both MiniMax-M3 per-rank shapes (16/1 and 64/4), every KV dtype, every size.
inline std::vector<BenchCase> pre_attention_bench_cases() {
  static constexpr int kShapes[][2] = {{16, 1}, {64, 4}};
  static constexpr DType kKv[] = {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4};
  std::vector<BenchCase> out;
  for (const auto& shape : kShapes)
    for (const DType dt : kKv)
      for (const std::int32_t n : kPreAttentionTokens) {
        BenchCase c = make_bench_case(BenchOp::pre_attention, false, shape[0], shape[1], dt, 0, n, 1);
        out.push_back(c);
      }
  return out;
}

// Bytes of one KV head's K and V row of one token in the cache.
inline double pre_attention_kv_row_bytes(DType dtype, ScaleMode mode) {
  if (dtype == DType::nvfp4) return 2.0 * double(nvfp4::kDataBytes + nvfp4::kScaleBytes);
  double b = 2.0 * kHeadDim * double(dtype_bytes(dtype));
  if (mode == ScaleMode::per_token_head) b += 2.0 * 4.0;
  return b;
}

// Bytes read and written by one pre-attention call of the case (see above).
inline double pre_attention_bytes_per_token(const BenchCase& c, ScaleMode mode) {
  const double nq = c.num_q_heads, nkv = c.num_kv_heads, niq = c.num_kv_heads;
  const double read = (nq + 2 * nkv + niq + 1) * kHeadDim * 2 + 8 + 8 + kRopeDims * 4;
  const double write = (nq + niq + 1) * kHeadDim * 2 + nkv * pre_attention_kv_row_bytes(c.dtype, mode);
  return read + write;
}

inline Traffic pre_attention_traffic(const BenchCase& c, ScaleMode mode) {
  Traffic t;
  t.bytes = double(c.num_tokens()) * pre_attention_bytes_per_token(c, mode) + 4.0 * kHeadDim * 4;
  return t;
}

}  // namespace msa::tool
