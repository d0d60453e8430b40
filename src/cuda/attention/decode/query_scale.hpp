// bf16 query rows staged for fp16 MMA: the fp8 and nvfp4 row kernels run on
// fp16 MMA whatever the output dtype, because their codes become fp16 in one
// instruction per pair (bf16 takes four). A bf16 row can hold values beyond
// fp16's range or below its normal range, so each row is multiplied by 2^-e,
// e chosen from the row's largest |q| so that it lands in [2^14, 2^15): every
// element within 2^29 of the largest is then exact in fp16 (the row's largest
// at least 2^-112), and none overflows. The row's scores come out 2^-e times the true ones; the kernel
// multiplies the row's score scale by 2^e. Host and device, so that a CPU test
// (tests/unit/test_query_scale.cpp) checks the claim over bf16's whole range.
#pragma once

#include <math.h>

#include <cstdint>

#include "msa/common.hpp"
#include "msa/numeric.hpp"

namespace msa::cuda::attention::qscale {

// The larger |x| of the two bf16 values in `pair` and `bits` (bf16 bits, sign
// cleared): as integers they order like the magnitudes, NaN above infinity.
MSA_HD std::uint32_t max_abs_bits(std::uint32_t bits, std::uint32_t pair) {
  const std::uint32_t lo = pair & 0x7fffu, hi = (pair >> 16) & 0x7fffu;
  const std::uint32_t m = lo > hi ? lo : hi;
  return m > bits ? m : bits;
}

// The row's exponent e from its largest |q| (bf16 bits, sign cleared): 0 for
// zero, infinite or NaN rows (staged as they are). e >= -126 keeps 2^e and
// 2^-e normal floats: rows whose largest |q| is below 2^-112 are scaled by
// 2^126 only, and keep their elements to within fp16's subnormal step.
inline constexpr int kMinRowExponent = -126;
MSA_HD int row_exponent(std::uint32_t max_abs_bits) {
  const float max_abs = num::bits_float(max_abs_bits << 16);
  if (!(max_abs > 0.0f) || !(max_abs < INFINITY)) return 0;
  const int e = ilogbf(max_abs) - 14;
  return e > kMinRowExponent ? e : kMinRowExponent;
}

// 2^e as a float (-127 < e < 128).
MSA_HD float pow2(int e) { return num::bits_float(std::uint32_t(127 + e) << 23); }

}  // namespace msa::cuda::attention::qscale
