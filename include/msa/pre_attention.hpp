// Pre-attention (contract 10): the step that turns the fused QKV projection
// output of a sparse layer into what msa reads. Per token and per 128-wide
// head: Gemma RMSNorm on q, k, index q and index k, partial NeoX RoPE on the
// same four, then q and index q into contiguous buffers and K, V and the index
// key into the paged caches, exactly as the inserts do. One pass over `qkv`.
//
// SEMANTICS (the CPU engine computes this; the CUDA kernel reproduces it bit
// for bit). For token i, head x = the 128 values of one head of qkv row i,
// read as fp32 (every fp32 operation below is rounded to nearest even on its
// own: no fused multiply-add, sqrt and division correctly rounded):
//  1. Norm (q, K, index q and index-key heads; V is left alone):
//       s    = sum of x[d]^2: 16 partial sums, partial c adds x[8c]^2 ..
//              x[8c+7]^2 in order, then the partials pairwise: p[c] += p[c+8],
//              then p[c] += p[c+4], p[c] += p[c+2], s = p[0] + p[1]
//       r    = 1 / sqrt(s * 2^-7 + eps)
//       y[d] = (x[d] * r) * (1 + w[d])        w: the head kind's weight [128]
//  2. RoPE on dims 0..63, c = cos_sin[positions[i], j], sn = cos_sin[positions[i], 32 + j],
//     for j < 32:  z[j] = y[j]*c - y[j+32]*sn,  z[j+32] = y[j+32]*c + y[j]*sn
//     (each product rounded, then the difference / sum); z[d] = y[d] for d >= 64.
//  3. u = z rounded to qkv_dtype: the head's unquantized value (V: u = x).
//  4. Stores, all from u:
//       q       [i, head]: u in q_dtype (bf16 / fp16: rounded; fp8 e4m3: sat(u / q_scale))
//       index q [i, head]: u in index_q_dtype (fp8 e4m3: the plain saturating cast)
//       K, V    at slots[i]: the bytes cpu::insert_kv writes for source rows u
//               (every KV dtype, layout, scale mode; per-(token, head) scales from u)
//       index key at index_slots[i]: the bytes cpu::insert_index writes for u
// So the result equals "norm + RoPE in fp32, round to the input dtype, then the
// insert": the unfused pipeline an engine would otherwise run.
//
// Skips: a negative slot skips that token's K and V (an index slot: its index
// key); q and index q are written for every token.
#pragma once

#include <cstdint>

#include "msa/common.hpp"
#include "msa/dtype.hpp"

namespace msa {

// MiniMax-M3's numbers (contract 10).
inline constexpr int kRopeDims = 64;             // RoPE rotates dims 0..63 of each head
inline constexpr double kM3RopeTheta = 5.0e6;    // the model's rope theta
inline constexpr float kM3NormEps = 1e-6f;       // the RMSNorm epsilon

struct PreAttentionArgs {
  // ---- input: the fused QKV projection output ----------------------------------------
  // Row i: nq query heads, nkv K heads, nkv V heads, niq index-query heads, one index-key head.
  const void* qkv = nullptr;         // [num_tokens, (nq + 2*nkv + niq + 1) * 128], qkv_dtype
  DType qkv_dtype = DType::bf16;     // bf16 or fp16
  std::int64_t qkv_row_stride = 0;   // elements between rows; 0: packed (the row's width)
  std::int64_t num_tokens = 0;
  std::int32_t num_q_heads = 0;      // nq
  std::int32_t num_kv_heads = 0;     // nkv; equals the KV cache's num_kv_heads
  std::int32_t num_index_heads = 0;  // niq (one per KV head in MiniMax-M3)
  const std::int64_t* positions = nullptr;  // [num_tokens] rows of cos_sin, in [0, max_position)

  // ---- Gemma RMSNorm --------------------------------------------------------------------
  const void* q_weight = nullptr;        // [128] weight_dtype
  const void* k_weight = nullptr;        // [128] weight_dtype
  const void* index_q_weight = nullptr;  // [128] weight_dtype
  const void* index_k_weight = nullptr;  // [128] weight_dtype
  DType weight_dtype = DType::f32;       // f32, bf16 or fp16
  float eps = kM3NormEps;                // finite, >= 0

  // ---- partial NeoX RoPE ------------------------------------------------------------------
  const void* cos_sin = nullptr;     // [max_position, 64] cos_sin_dtype: cos in 0..31, sin in 32..63
  DType cos_sin_dtype = DType::f32;  // f32, bf16 or fp16
  std::int64_t max_position = 0;     // rows of cos_sin

  // ---- outputs ------------------------------------------------------------------------------
  void* q = nullptr;                  // [num_tokens, nq * 128] q_dtype
  DType q_dtype = DType::bf16;        // bf16, fp16 or fp8_e4m3
  float q_scale = 1.0f;               // fp8 q: stored = sat(u / q_scale); finite, > 0
  void* index_q = nullptr;            // [num_tokens, niq * 128] index_q_dtype
  DType index_q_dtype = DType::bf16;  // bf16, fp16, or fp8_e4m3 with an fp8_e4m3 index cache
  const std::int64_t* slots = nullptr;        // [num_tokens] main-cache slots; negative = skip
  const std::int64_t* index_slots = nullptr;  // [num_tokens] index-cache slots; null: `slots`

  // Heads in one qkv row, and its width in elements.
  std::int64_t heads_per_token() const {
    return std::int64_t(num_q_heads) + 2 * std::int64_t(num_kv_heads) + num_index_heads + 1;
  }
  std::int64_t row_width() const { return heads_per_token() * kHeadDim; }
  std::int64_t row_stride() const { return qkv_row_stride > 0 ? qkv_row_stride : row_width(); }
};

// The cos/sin table of partial NeoX RoPE with base `theta`: row p holds
// cos(p * theta^(-j/32)) in column j and the sine in column 32 + j, j < 32,
// computed in float64 and rounded to fp32.
//   out: [max_position, 64]
void make_rope_table(double theta, std::int64_t max_position, float* out);

}  // namespace msa
