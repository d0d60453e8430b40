// The e2m1 code of a float (round to nearest, ties to even, saturating at 6,
// NaN -> 0, -0 and values that round to 0 -> +0), bit-identical to
// num::float_to_e2m1 for every float, without its chain of compares and
// branches (lanes of a warp disagree on where a value falls, so a branch per
// threshold splits the warp):
//  - |f| >= 1: the e2m1 normals 1 .. 6 have one mantissa bit, so |f|'s bits
//    rounded to nearest even at bit 22 give exponent and mantissa, code =
//    rounded >> 22 - 252, capped at 7 (which also takes inf);
//  - |f| < 1: codes 0, 1, 2 are 2 |f| rounded to nearest even, one FMA with
//    the 1.5 * 2^23 trick.
// Host and device, so that tests/unit/test_e2m1_code.cpp compares it with
// num::float_to_e2m1 on the host.
#pragma once

#include <cmath>
#include <cstdint>

#include "msa/common.hpp"
#include "msa/numeric.hpp"

namespace msa::cuda {

MSA_HD std::uint32_t e2m1_code(float f) {
  const std::uint32_t bits = num::float_bits(f);
  const std::uint32_t u = bits & 0x7FFFFFFFu;  // |f|
  // 2 |f| + 1.5 * 2^23 is rounded to an integer (ties to even) in its low bits.
#if defined(__CUDA_ARCH__)
  const float small = __fmaf_rn(num::bits_float(u), 2.0f, 12582912.0f);
#else
  const float small = std::fma(num::bits_float(u), 2.0f, 12582912.0f);
#endif
  const std::uint32_t code_small = num::float_bits(small) - 0x4B400000u;
  const std::uint32_t rounded = u + 0x1FFFFFu + ((u >> 22) & 1u);
  const std::uint32_t code_big = (rounded >> 22) - 252u;
  std::uint32_t m = u < 0x3F800000u ? code_small : (code_big < 7u ? code_big : 7u);
  if (u > 0x7F800000u) m = 0;  // NaN
  return m | (m != 0 ? (bits >> 28) & 8u : 0u);
}

}  // namespace msa::cuda
