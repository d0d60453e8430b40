// FloatDivisor (src/cuda/common/float_divisor.hpp): every quotient must be
// bit-identical to the IEEE division x / d, on random operands over the whole
// reciprocal range, on every divisor significand, and at the edges where the
// plain division takes over.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cuda/common/float_divisor.hpp"
#include "msa/numeric.hpp"

namespace {

using msa::cuda::FloatDivisor;
using msa::num::bits_float;
using msa::num::float_bits;

// Same bits, or both NaN.
bool same(float a, float b) { return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b)); }

// A float with the given unbiased exponent, significand bits and sign.
float make(int exponent, std::uint32_t significand, bool negative) {
  return bits_float((negative ? 0x80000000u : 0u) | (std::uint32_t(exponent + 127) << 23) | (significand & 0x7FFFFFu));
}

TEST(FloatDivisor, RandomOperandsOverTheReciprocalRange) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> exponent(-60, 59);
  std::uniform_int_distribution<std::uint32_t> significand(0, 0x7FFFFFu);
  std::int64_t checked = 0;
  for (int i = 0; i < 4000; ++i) {
    const float d = make(exponent(rng), significand(rng), false);
    const FloatDivisor div(d);
    for (int j = 0; j < 2000; ++j) {
      const float x = make(exponent(rng), significand(rng), rng() & 1);
      ASSERT_EQ(float_bits(div(x)), float_bits(x / d)) << x << " / " << d;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 8000000);
}

TEST(FloatDivisor, EveryDivisorSignificand) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::uint32_t> significand(0, 0x7FFFFFu);
  for (std::uint32_t s = 0; s <= 0x7FFFFFu; ++s) {
    const float d = make(int(s % 7) - 3, s, false);
    const FloatDivisor div(d);
    // A random dividend and one whose significand is all ones.
    const float a = make(int(rng() % 9) - 4, significand(rng), rng() & 1);
    const float b = make(int(s % 5) - 2, 0x7FFFFFu, s & 1);
    ASSERT_EQ(float_bits(div(a)), float_bits(a / d)) << a << " / " << d;
    ASSERT_EQ(float_bits(div(b)), float_bits(b / d)) << b << " / " << d;
  }
}

TEST(FloatDivisor, EdgesTakeThePlainDivision) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const std::vector<float> xs = {0.0f, -0.0f, inf, -inf, nan, tiny, -tiny, 1e-40f, big, -big,
                                 std::ldexp(1.0f, -60), -std::ldexp(1.0f, -60), std::nextafter(std::ldexp(1.0f, -60), 0.0f),
                                 std::ldexp(1.0f, 60), std::nextafter(std::ldexp(1.0f, 60), 0.0f), -std::ldexp(1.0f, 59),
                                 1.0f, -3.0f, 448.0f, 6.0f, 0.25f, 1e30f, -1e-30f};
  const std::vector<float> ds = {1.0f, 6.0f, 448.0f, 0.001953125f, 3.0f, 1e-18f, 1e18f, std::ldexp(1.0f, -60),
                                 std::nextafter(std::ldexp(1.0f, 60), 0.0f), std::ldexp(1.0f, 60), 0.0f, -0.0f,
                                 -2.0f, inf, nan, tiny, big, 1e-30f};
  for (const float d : ds) {
    const FloatDivisor div(d);
    for (const float x : xs) {
      EXPECT_TRUE(same(div(x), x / d)) << x << " / " << d << ": got " << div(x) << " want " << x / d;
    }
  }
}

TEST(FloatDivisor, GroupsOfOperands) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 20000; ++trial) {
    const float d = std::fabs(g(rng)) * std::ldexp(1.0f, int(rng() % 41) - 20) + 1e-6f;
    const FloatDivisor div(d);
    float x[8], q[8];
    for (float& v : x) v = g(rng) * std::ldexp(1.0f, int(rng() % 41) - 20);
    // Now and then an operand that sends the group to the plain division.
    if (trial % 5 == 0) x[rng() % 8] = std::vector<float>{inf, -inf, 1e-30f, 3e38f, 0.0f, -0.0f}[rng() % 6];
    div.divide<8>(x, q);
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(same(q[i], x[i] / d)) << "trial " << trial << " element " << i;
    div.divide<8>(x, x);  // in place
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(same(x[i], q[i])) << "trial " << trial << " in place, element " << i;
  }
}

}  // namespace
