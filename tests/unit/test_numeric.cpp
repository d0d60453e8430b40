// Bit-exact tests of include/msa/numeric.hpp against tables computed here from
// the format definitions (sign, exponent, mantissa), never from numeric.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "msa/numeric.hpp"

namespace {

using std::uint16_t;
using std::uint32_t;
using std::uint8_t;

// ---- independent definitions ------------------------------------------------
// A binary format with E exponent bits, M mantissa bits and bias B. `ieee_top`:
// the all-ones exponent holds inf/NaN (fp16, bf16, e5m2); otherwise only the
// all-ones code is NaN (e4m3fn).
struct Format {
  int E, M, B;
  bool ieee_top;
};
constexpr Format kBf16{8, 7, 127, true};
constexpr Format kFp16{5, 10, 15, true};
constexpr Format kE4m3{4, 3, 7, false};
constexpr Format kE5m2{5, 2, 15, true};
constexpr Format kE2m1{2, 1, 1, false};  // no inf, no NaN (handled separately)

double decode_ref(const Format& f, uint32_t code) {
  const uint32_t s = (code >> (f.E + f.M)) & 1u;
  const uint32_t e = (code >> f.M) & ((1u << f.E) - 1u);
  const uint32_t m = code & ((1u << f.M) - 1u);
  const uint32_t emax = (1u << f.E) - 1u;
  double v;
  if (f.ieee_top && e == emax) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.ieee_top && f.E == 4 && e == emax && m == (1u << f.M) - 1u) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - f.B - f.M);  // subnormal: 0.m * 2^(1-B)
  } else {
    v = std::ldexp(double((1u << f.M) + m), int(e) - f.B - f.M);  // 1.m * 2^(e-B)
  }
  return s ? -v : v;
}

bool same_value(double want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return double(got) == want && std::signbit(double(got)) == std::signbit(want);
}

// Nearest finite code with the sign of x, ties to the even code; the search
// runs over every finite code of the format (brute force). `sat` clamps
// |x| > max to max; without it, inf is one more candidate above max
// (value 2^(emax+1)) so that the IEEE overflow rule falls out of the search.
struct Codebook {
  Format f;
  std::vector<uint32_t> codes;  // finite non-negative codes, ascending value
  std::vector<double> values;
  uint32_t inf_code = 0;        // 0 when the encoder saturates
  uint32_t sign_bit = 0;
};

Codebook make_codebook(const Format& f, bool saturating) {
  Codebook b;
  b.f = f;
  b.sign_bit = 1u << (f.E + f.M);
  for (uint32_t c = 0; c < b.sign_bit; ++c) {
    const double v = decode_ref(f, c);
    if (std::isfinite(v)) {
      b.codes.push_back(c);
      b.values.push_back(v);
    }
  }
  if (!saturating) {
    b.inf_code = ((1u << f.E) - 1u) << f.M;
    b.codes.push_back(b.inf_code);
    b.values.push_back(std::ldexp(1.0, (1 << f.E) - 1 - f.B));  // first value past the top exponent
  }
  return b;
}

// Linear search over every candidate: used for the small formats.
uint32_t nearest_linear(const Codebook& b, float x) {
  const double a = std::fabs(double(x));
  const uint32_t s = std::signbit(x) ? b.sign_bit : 0u;
  // Beyond the top (inf included): saturating max, or inf. Below it every
  // distance that decides a tie is exact in double.
  if (a >= b.values.back()) return s | b.codes.back();
  std::size_t best = 0;
  double best_d = std::fabs(a - b.values[0]);
  for (std::size_t i = 1; i < b.codes.size(); ++i) {
    const double d = std::fabs(a - b.values[i]);
    if (d < best_d || (d == best_d && (b.codes[i] & 1u) == 0 && (b.codes[best] & 1u) != 0)) {
      best = i;
      best_d = d;
    }
  }
  return s | b.codes[best];
}

// The same search by bisection over the ascending values (for bf16/fp16).
uint32_t nearest_bisect(const Codebook& b, float x) {
  const double a = std::fabs(double(x));
  const uint32_t s = std::signbit(x) ? b.sign_bit : 0u;
  if (a >= b.values.back()) return s | b.codes.back();
  const auto it = std::upper_bound(b.values.begin(), b.values.end(), a);
  const std::size_t hi = std::size_t(it - b.values.begin());
  const std::size_t lo = hi - 1;  // values[0] = 0 <= a
  const double dl = a - b.values[lo], dh = b.values[hi] - a;
  std::size_t pick = dl < dh ? lo : (dh < dl ? hi : ((b.codes[lo] & 1u) == 0 ? lo : hi));
  return s | b.codes[pick];
}

float f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Inputs for the encoders: every bf16 pattern, exact midpoints between adjacent
// codes of `b` (and one float ulp either side), and random floats.
std::vector<float> encoder_inputs(const Codebook& b, std::uint64_t seed, int num_random) {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 65536; ++h) xs.push_back(f32(h << 16));
  for (std::size_t i = 0; i + 1 < b.values.size(); ++i) {
    const float mid = float(0.5 * (b.values[i] + b.values[i + 1]));
    if (double(mid) != 0.5 * (b.values[i] + b.values[i + 1])) continue;  // not a float
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 20);
  for (int i = 0; i < num_random; ++i) {
    xs.push_back(f32(any_bits(rng)));
    xs.push_back(std::ldexp(unit(rng), expo(rng)));
  }
  xs.push_back(INFINITY);
  xs.push_back(-INFINITY);
  xs.push_back(std::numeric_limits<float>::max());
  xs.push_back(std::numeric_limits<float>::denorm_min());
  xs.push_back(-std::numeric_limits<float>::denorm_min());
  return xs;
}

constexpr std::uint64_t kSeed = 20240611;

// ---- bf16 / fp16 -----------------------------------------------------------------

TEST(Numeric, Bf16DecodesAllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    SCOPED_TRACE(testing::Message() << "bf16 code 0x" << std::hex << c);
    EXPECT_TRUE(same_value(decode_ref(kBf16, c), msa::num::bf16_to_float(uint16_t(c))));
  }
}

TEST(Numeric, Fp16DecodesAllCodes) {
  for (uint32_t c = 0; c < 65536; ++c) {
    SCOPED_TRACE(testing::Message() << "fp16 code 0x" << std::hex << c);
    EXPECT_TRUE(same_value(decode_ref(kFp16, c), msa::num::fp16_to_float(uint16_t(c))));
  }
}

template <typename Encode>
void check_half_encoder(const Format& f, Encode encode, const char* name) {
  const Codebook b = make_codebook(f, /*saturating=*/false);
  // Round trip of every non-NaN code.
  for (uint32_t c = 0; c < 65536; ++c) {
    const double v = decode_ref(f, c);
    if (std::isnan(v)) {
      EXPECT_EQ(encode(float(v)), 0x7FFF) << name << " NaN from code 0x" << std::hex << c;
      continue;
    }
    ASSERT_EQ(encode(float(v)), c) << name << " round trip of code 0x" << std::hex << c;
  }
  const std::vector<float> xs = encoder_inputs(b, kSeed, 200000);
  SCOPED_TRACE(testing::Message() << name << " seed " << kSeed);
  int bad = 0;
  for (float x : xs) {
    if (std::isnan(x)) {
      EXPECT_EQ(encode(x), 0x7FFF);
      continue;
    }
    const uint32_t want = nearest_bisect(b, x);
    const uint32_t got = encode(x);
    if (got != want && ++bad <= 10) {
      ADD_FAILURE() << name << "(" << x << " = 0x" << std::hex << bits(x) << ") = 0x" << got
                    << ", expected 0x" << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Numeric, FloatToBf16MatchesNearestEven) {
  check_half_encoder(kBf16, msa::num::float_to_bf16, "float_to_bf16");
}

TEST(Numeric, FloatToFp16MatchesNearestEven) {
  check_half_encoder(kFp16, msa::num::float_to_fp16, "float_to_fp16");
}

TEST(Numeric, HalfSpecialValues) {
  using namespace msa::num;
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // the tie goes to the even code: inf
  EXPECT_EQ(float_to_fp16(1e6f), 0x7C00);
  EXPECT_EQ(float_to_fp16(-1e6f), 0xFC00);
  EXPECT_EQ(float_to_fp16(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_fp16(NAN), 0x7FFF);
  EXPECT_EQ(float_to_fp16(-NAN), 0x7FFF);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even (2)
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xFF80);
  EXPECT_EQ(float_to_bf16(NAN), 0x7FFF);
  EXPECT_EQ(float_to_bf16(f32(0xFFC00001u)), 0x7FFF);
  EXPECT_EQ(float_to_bf16(f32(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(f32(0x3F818000u)), 0x3F82);  // tie, odd rounds up
}

// ---- fp8 -----------------------------------------------------------------------

TEST(Numeric, E4m3DecodesAllCodes) {
  int nans = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    SCOPED_TRACE(testing::Message() << "e4m3 code 0x" << std::hex << c);
    const double want = decode_ref(kE4m3, c);
    nans += std::isnan(want);
    EXPECT_TRUE(same_value(want, msa::num::e4m3_to_float(uint8_t(c))));
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF only: e4m3fn has no inf
  EXPECT_EQ(msa::num::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(msa::num::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Numeric, E5m2DecodesAllCodes) {
  for (uint32_t c = 0; c < 256; ++c) {
    SCOPED_TRACE(testing::Message() << "e5m2 code 0x" << std::hex << c);
    EXPECT_TRUE(same_value(decode_ref(kE5m2, c), msa::num::e5m2_to_float(uint8_t(c))));
  }
  EXPECT_EQ(msa::num::e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(msa::num::e5m2_to_float(0x7C), INFINITY);
}

template <typename Encode>
void check_fp8_encoder(const Format& f, Encode encode, const char* name, double max_finite) {
  const Codebook b = make_codebook(f, /*saturating=*/true);
  EXPECT_EQ(b.values.back(), max_finite);
  for (uint32_t c = 0; c < 256; ++c) {
    const double v = decode_ref(f, c);
    if (std::isnan(v)) {
      EXPECT_EQ(encode(float(v)), 0x7F) << name << " NaN from code 0x" << std::hex << c;
    } else if (std::isinf(v)) {
      EXPECT_EQ(encode(float(v)), (c & 0x80u) | b.codes.back()) << name << " saturates inf";
    } else {
      EXPECT_EQ(encode(float(v)), c) << name << " round trip of code 0x" << std::hex << c;
    }
  }
  const std::vector<float> xs = encoder_inputs(b, kSeed + 1, 100000);
  SCOPED_TRACE(testing::Message() << name << " seed " << kSeed + 1);
  int bad = 0;
  for (float x : xs) {
    if (std::isnan(x)) {
      EXPECT_EQ(encode(x), 0x7F);
      continue;
    }
    const uint32_t want = nearest_linear(b, x);
    const uint32_t got = encode(x);
    if (got != want && ++bad <= 10) {
      ADD_FAILURE() << name << "(" << x << " = 0x" << std::hex << bits(x) << ") = 0x" << got
                    << ", expected 0x" << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Numeric, FloatToE4m3MatchesNearestEvenSaturating) {
  check_fp8_encoder(kE4m3, msa::num::float_to_e4m3, "float_to_e4m3", 448.0);
  using msa::num::float_to_e4m3;
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-1e9f), 0xFE);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_EQ(float_to_e4m3(-NAN), 0x7F);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie between 0 and 2^-9: even
  EXPECT_EQ(float_to_e4m3(-std::ldexp(1.0f, -11)), 0x80);  // sign kept on zero
}

TEST(Numeric, FloatToE5m2MatchesNearestEvenSaturating) {
  check_fp8_encoder(kE5m2, msa::num::float_to_e5m2, "float_to_e5m2", 57344.0);
  using msa::num::float_to_e5m2;
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7B);  // would round to inf: saturates
  EXPECT_EQ(float_to_e5m2(INFINITY), 0x7B);
  EXPECT_EQ(float_to_e5m2(-INFINITY), 0xFB);
  EXPECT_EQ(float_to_e5m2(NAN), 0x7F);
}

// ---- e2m1 ----------------------------------------------------------------------

TEST(Numeric, E2m1DecodesAllCodes) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint32_t c = 0; c < 16; ++c) {
    SCOPED_TRACE(testing::Message() << "e2m1 code " << c);
    const double want = decode_ref(kE2m1, c);
    EXPECT_EQ(std::fabs(want), magnitudes[c & 7]);
    EXPECT_TRUE(same_value(want, msa::num::e2m1_to_float(uint8_t(c))));
  }
}

TEST(Numeric, FloatToE2m1MatchesNearestEvenSaturating) {
  const Codebook b = make_codebook(kE2m1, /*saturating=*/true);
  ASSERT_EQ(b.values.size(), 8u);
  std::vector<float> xs = encoder_inputs(b, kSeed + 2, 20000);
  for (int i = -2000; i <= 2000; ++i) xs.push_back(float(i) / 256.0f);  // dense over [-8, 8]
  SCOPED_TRACE(testing::Message() << "seed " << kSeed + 2);
  int bad = 0;
  for (float x : xs) {
    uint32_t want = std::isnan(x) ? 0u : nearest_linear(b, x);
    if (want == 8u) want = 0u;  // negative zero is never written
    const uint32_t got = msa::num::float_to_e2m1(x);
    if (got != want && ++bad <= 10) {
      ADD_FAILURE() << "float_to_e2m1(" << x << ") = " << got << ", expected " << want;
    }
  }
  EXPECT_EQ(bad, 0);
  using msa::num::float_to_e2m1;
  EXPECT_EQ(float_to_e2m1(0.25f), 0);   // tie 0 / 0.5: even code 0
  EXPECT_EQ(float_to_e2m1(0.75f), 2);   // tie 0.5 / 1: even code 2
  EXPECT_EQ(float_to_e2m1(2.5f), 4);    // tie 2 / 3: even code 4
  EXPECT_EQ(float_to_e2m1(5.0f), 6);    // tie 4 / 6: even code 6
  EXPECT_EQ(float_to_e2m1(-5.0f), 14);
  EXPECT_EQ(float_to_e2m1(100.0f), 7);  // saturates
  EXPECT_EQ(float_to_e2m1(-INFINITY), 15);
  EXPECT_EQ(float_to_e2m1(-0.0f), 0);   // no negative zero
  EXPECT_EQ(float_to_e2m1(-0.2f), 0);
  EXPECT_EQ(float_to_e2m1(NAN), 0);
}

// ---- nvfp4 group scale (contract 4.3) ------------------------------------------

TEST(Numeric, Nvfp4GroupScaleRule) {
  const Codebook e4m3 = make_codebook(kE4m3, /*saturating=*/true);
  std::mt19937_64 rng(kSeed + 3);
  SCOPED_TRACE(testing::Message() << "seed " << kSeed + 3);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  const float floor_v = std::ldexp(1.0f, -9);
  for (int i = 0; i < 20000; ++i) {
    const float amax = i % 97 == 0 ? 0.0f : std::ldexp(unit(rng), expo(rng));
    const float s = std::ldexp(0.5f + unit(rng), expo(rng) / 2);
    // sf = e4m3_satfinite(max(amax / 6 / s, 2^-9)).
    float t = amax / 6.0f / s;
    if (t < floor_v) t = floor_v;
    const uint32_t want = nearest_linear(e4m3, t);
    ASSERT_EQ(msa::num::nvfp4_group_scale(amax, s), want) << "amax " << amax << " s " << s;
  }
  using msa::num::nvfp4_group_scale;
  EXPECT_EQ(nvfp4_group_scale(0.0f, 1.0f), 0x01);        // floor 2^-9
  EXPECT_EQ(nvfp4_group_scale(1e-6f, 1.0f), 0x01);
  EXPECT_EQ(nvfp4_group_scale(6.0f, 1.0f), 0x38);        // 1.0
  EXPECT_EQ(nvfp4_group_scale(6.0f * 448.0f, 1.0f), 0x7E);
  EXPECT_EQ(nvfp4_group_scale(1e30f, 1.0f), 0x7E);       // satfinite
  EXPECT_EQ(nvfp4_group_scale(INFINITY, 1.0f), 0x7E);
  EXPECT_EQ(nvfp4_group_scale(NAN, 1.0f), 0x01);
  EXPECT_EQ(nvfp4_group_scale(12.0f, 2.0f), 0x38);       // 12 / 6 / 2 = 1
}

TEST(Numeric, Nvfp4EncodeElement) {
  const Codebook e2m1 = make_codebook(kE2m1, /*saturating=*/true);
  std::mt19937_64 rng(kSeed + 4);
  SCOPED_TRACE(testing::Message() << "seed " << kSeed + 4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) {
    const uint8_t sf = uint8_t(1 + i % 126);
    const float s = std::ldexp(1.0f + 0.25f * float(i % 4), i % 7 - 3);
    const float x = normal(rng) * float(decode_ref(kE4m3, sf)) * s * 4.0f;
    uint32_t want = nearest_linear(e2m1, x / s / float(decode_ref(kE4m3, sf)));
    if (want == 8u) want = 0u;
    ASSERT_EQ(msa::num::nvfp4_encode(x, sf, s), want) << "x " << x << " sf " << int(sf) << " s " << s;
  }
}

TEST(Numeric, LoadAsFloatByTag) {
  const uint16_t h[2] = {0x3F80, 0xC000};  // bf16 1, -2; fp16 1.875, -2
  const uint8_t b[2] = {0x38, 0xBC};       // e4m3 1, -1.5; e5m2 0.5, -1
  EXPECT_EQ(msa::num::load_as_float<0>(h, 1), -2.0f);
  EXPECT_EQ(msa::num::load_as_float<1>(h, 0), 1.875f);
  EXPECT_EQ(msa::num::load_as_float<2>(b, 1), -1.5f);
  EXPECT_EQ(msa::num::load_as_float<3>(b, 0), 0.5f);
}

// The indexer's decode scoring of nvfp4 keys (src/cuda/indexer/mma.cuh,
// e2m1x8_to_f16x2_scaled) puts an e2m1 code's bits in an fp16 (sign at bit
// 15, magnitude at bits 11..9), which reads as the code's value times 2^-14,
// then multiplies by the group scale times 2^7 in fp16. Both steps are exact
// for every code and every finite e4m3 scale.
TEST(Numeric, E2m1PlacedInFp16AndScaledIsExact) {
  for (int code = 0; code < 16; ++code) {
    const auto bits = uint16_t(((code & 8) << 12) | ((code & 7) << 9));
    const float v = msa::num::e2m1_to_float(uint8_t(code));
    ASSERT_EQ(msa::num::fp16_to_float(bits), std::ldexp(v, -14)) << "code " << code;
    for (int sc = 0; sc < 256; ++sc) {
      const float s = msa::num::e4m3_to_float(uint8_t(sc));
      if (std::isnan(s)) continue;
      ASSERT_EQ(msa::num::fp16_to_float(msa::num::float_to_fp16(s * 128.0f)), s * 128.0f) << "scale " << sc;
      // The fp16 product rounds the exact one; it must not move.
      const double exact = double(v) * double(s) / 128.0;
      ASSERT_EQ(double(msa::num::fp16_to_float(msa::num::float_to_fp16(float(exact)))), exact)
          << "code " << code << " scale " << sc;
    }
  }
}

}  // namespace
