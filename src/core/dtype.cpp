#include "msa/dtype.hpp"

#include <string>

#include "msa/error.hpp"

namespace msa {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
    case DType::nvfp4: return "nvfp4";
    case DType::i32: return "i32";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name, std::string_view argument) {
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::fp16;
  if (name == "fp8_e4m3" || name == "fp8" || name == "e4m3" || name == "fp8_e4m3fn") return DType::fp8_e4m3;
  if (name == "fp8_e5m2" || name == "e5m2") return DType::fp8_e5m2;
  if (name == "nvfp4") return DType::nvfp4;
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "i32" || name == "int32") return DType::i32;
  fail(argument, " = '", std::string(name),
       "' is not a dtype (expected bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4)");
}

std::size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::fp16: return 2;
    case DType::fp8_e4m3: case DType::fp8_e5m2: return 1;
    case DType::nvfp4: return 0;
  }
  return 0;
}

float fp8_max(DType t) {
  if (t == DType::fp8_e4m3) return 448.0f;
  if (t == DType::fp8_e5m2) return 57344.0f;
  fail("fp8_max: dtype ", dtype_name(t), " is not an fp8 format");
}

}  // namespace msa
