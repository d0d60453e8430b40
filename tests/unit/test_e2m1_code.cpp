// e2m1_code (src/cuda/common/e2m1_code.hpp), the GPU quantizer's branch-free
// e2m1 encoder, must equal num::float_to_e2m1 on every float: here on every
// float of magnitude in [1/8, 8] (every threshold and its neighbours), both
// signs, on random floats of every exponent, and on the special values.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>

#include "cuda/common/e2m1_code.hpp"
#include "msa/numeric.hpp"

namespace {

using msa::cuda::e2m1_code;
using msa::num::bits_float;
using msa::num::float_to_e2m1;

TEST(E2m1Code, EveryFloatAroundTheThresholds) {
  // 0x3E000000 = 0.125, 0x41000000 = 8.
  for (std::uint32_t u = 0x3E000000u; u <= 0x41000000u; ++u) {
    for (const std::uint32_t sign : {0u, 0x80000000u}) {
      const float f = bits_float(u | sign);
      ASSERT_EQ(e2m1_code(f), float_to_e2m1(f)) << f << " (0x" << std::hex << (u | sign) << ")";
    }
  }
}

TEST(E2m1Code, RandomFloatsOfEveryExponent) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (std::uint32_t e = 0; e < 256; ++e) {
    for (int i = 0; i < 20000; ++i) {
      const std::uint32_t bits = (rng() & 0x80000000u) | (e << 23) | (rng() & 0x7FFFFFu);
      const float f = bits_float(bits);
      ASSERT_EQ(e2m1_code(f), float_to_e2m1(f)) << "0x" << std::hex << bits;
    }
  }
}

TEST(E2m1Code, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float f : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                        -std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
                        -std::numeric_limits<float>::max(), 0.25f, -0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                        6.0f, -6.0f, 0.999999f, -0.2500001f})
    EXPECT_EQ(e2m1_code(f), float_to_e2m1(f)) << f;
}

}  // namespace
