// Element types of queries, outputs and caches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace msa {

enum class DType : std::uint8_t {
  f32,
  bf16,
  fp16,
  fp8_e4m3,  // OCP e4m3fn: max 448, no inf, NaN = S.1111.111
  fp8_e5m2,  // OCP e5m2: max 57344, inf and NaN
  nvfp4,     // e2m1 codes in 16-element groups with e4m3 group scales
  i32,
};

// "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "nvfp4", "f32", "i32".
const char* dtype_name(DType t);
// Accepts the names above plus the aliases "bfloat16", "float16", "fp8" (e4m3),
// "e4m3", "e5m2". Throws msa::Error naming `argument` on anything else.
DType parse_dtype(std::string_view name, std::string_view argument = "dtype");
// Bytes per element; nvfp4 has no whole-byte element and answers 0.
std::size_t dtype_bytes(DType t);
inline bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }
// Query and output dtypes: bf16 or fp16.
inline bool is_half(DType t) { return t == DType::bf16 || t == DType::fp16; }
// Largest finite value of an fp8 format (448 or 57344).
float fp8_max(DType t);

}  // namespace msa
