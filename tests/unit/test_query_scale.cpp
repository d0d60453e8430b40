// The fp8 / nvfp4 row kernels stage bf16 query rows as fp16 times 2^-e
// (src/cuda/attention/query_scale.hpp). Over bf16's whole range, a staged row
// never overflows fp16, every element within 2^29 of the row's largest comes
// back exactly (fp16 -> float times 2^e) when that largest is at least
// 2^-112, and the smaller ones within half fp16's subnormal step times 2^e.
// Zero, infinite and NaN rows keep e = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cuda/attention/decode/query_scale.hpp"
#include "msa/numeric.hpp"

namespace {

namespace qs = msa::cuda::attention::qscale;
namespace num = msa::num;

// The row's largest |q| as bf16 bits, through max_abs_bits on packed pairs.
std::uint32_t row_max_bits(const std::vector<std::uint16_t>& row) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i + 1 < row.size(); i += 2) m = qs::max_abs_bits(m, row[i] | (std::uint32_t(row[i + 1]) << 16));
  return m;
}

// Stages a row as the kernel does and checks every element.
void check_row(const std::vector<std::uint16_t>& row) {
  const std::uint32_t bits = row_max_bits(row);
  const float max_abs = num::bf16_to_float(std::uint16_t(bits));
  const int e = qs::row_exponent(bits);
  const float down = qs::pow2(-e), up = qs::pow2(e);
  ASSERT_EQ(down * up, 1.0f) << "e " << e;
  for (std::uint16_t h : row) {
    const float x = num::bf16_to_float(h);
    const std::uint16_t f16 = num::float_to_fp16(x * down);
    const float back = num::fp16_to_float(f16) * up;
    ASSERT_TRUE(std::isfinite(num::fp16_to_float(f16))) << "x " << x << " max " << max_abs << " e " << e;
    if (e > qs::kMinRowExponent && std::fabs(x) >= std::ldexp(max_abs, -29)) {
      ASSERT_EQ(back, x) << "x " << x << " max " << max_abs << " e " << e;
    } else {
      // Below fp16's normal range after scaling: off by at most half its subnormal step.
      ASSERT_LE(std::fabs(back - x), std::ldexp(up, -25)) << "x " << x << " max " << max_abs << " e " << e;
    }
  }
  // The largest lands in [2^14, 2^15) unless e was clamped (or the row is zero).
  const float top = max_abs * down;
  if (e > qs::kMinRowExponent && max_abs > 0.0f) {
    EXPECT_GE(top, 16384.0f);
    EXPECT_LT(top, 32768.0f);
  }
}

TEST(QueryScale, RowsOverBf16sWholeRangeStageExactly) {
  std::mt19937_64 rng(20261130);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int top = -133; top <= 127; ++top) {    // the row's largest binade
    for (int spread : {0, 8, 30, 60}) {         // how far below it the others reach
      std::vector<std::uint16_t> row(128);
      for (auto& h : row) {
        const int exp = top - int(rng() % std::uint64_t(spread + 1));
        h = num::float_to_bf16(std::ldexp(0.5f + 0.5f * std::fabs(normal(rng)) / 4.0f, exp) *
                               (rng() & 1 ? -1.0f : 1.0f));
      }
      check_row(row);
    }
  }
}

TEST(QueryScale, ExtremeAndSpecialRows) {
  const std::uint16_t kMaxBf16 = 0x7f7f, kMinSub = 0x0001, kInf = 0x7f80, kNan = 0x7fc0;
  check_row(std::vector<std::uint16_t>(128, kMaxBf16));
  check_row(std::vector<std::uint16_t>(128, kMinSub));
  check_row(std::vector<std::uint16_t>(128, 0));
  EXPECT_EQ(qs::row_exponent(0), 0);
  EXPECT_EQ(qs::row_exponent(kInf), 0);
  EXPECT_EQ(qs::row_exponent(kNan), 0);
  EXPECT_EQ(qs::row_exponent(kMaxBf16), 113);
  EXPECT_EQ(qs::row_exponent(kMinSub), qs::kMinRowExponent);
  EXPECT_EQ(qs::row_exponent(num::float_to_bf16(1.0f)), -14);
  // NaN orders above infinity, infinity above every finite value, the sign is ignored.
  EXPECT_EQ(qs::max_abs_bits(0, kNan | (std::uint32_t(kInf) << 16)), kNan);
  EXPECT_EQ(qs::max_abs_bits(0, 0x8000u | kInf), kInf);
  EXPECT_EQ(qs::max_abs_bits(0x3f80, 0xbf800000u | 0x4000u), 0x4000u);
}

}  // namespace
