// The float64 oracle of pre-attention (contract 10, msa/pre_attention.hpp):
// Gemma RMSNorm and partial NeoX RoPE of every head of every token, in
// float64, from the host arguments. It shares no code with the engines: the
// formulas are the contract's, the inputs are read with the scalar decoders of
// msa/numeric.hpp.
//
// An engine computes in fp32 and rounds to the qkv dtype; where the float64
// value lies within the fp32 error bound of a rounding midpoint, either
// neighbour is a correct result. `slack` bounds |fp32 result - float64 value|
// (2^-18 of the magnitudes involved, several times the worst case of the
// SEMANTICS' operation count), and admits() says whether a rounded value is
// one the fp32 computation may give.
#pragma once

#include <cstdint>
#include <vector>

#include "msa/dtype.hpp"
#include "msa/pre_attention.hpp"

namespace msa::ref {

struct PreAttentionRef {
  std::int64_t num_tokens = 0;
  std::int64_t heads = 0;     // per token: nq + 2 * nkv + niq + 1
  DType dtype = DType::bf16;  // the qkv dtype the values round to
  std::vector<double> z;      // [num_tokens, heads, 128] norm + RoPE (V heads: the input)
  std::vector<double> slack;  // [num_tokens, heads, 128] fp32 error bound (0 for V)

  std::int64_t index(std::int64_t token, std::int64_t head, int d) const {
    return (token * heads + head) * 128 + d;
  }
  // z rounded to the qkv dtype (nearest even), as float.
  float rounded(std::int64_t token, std::int64_t head, int d) const;
  // True when u (a value of the qkv dtype) is what an fp32 computation may
  // round to: between the roundings of z - slack and z + slack (NaN for NaN).
  bool admits(std::int64_t token, std::int64_t head, int d, float u) const;
  // True when two roundings are admissible for this element.
  bool ambiguous(std::int64_t token, std::int64_t head, int d) const;
};

// Every head of every token. Host pointers; positions must be inside the table.
PreAttentionRef pre_attention_reference(const PreAttentionArgs& args);

}  // namespace msa::ref
