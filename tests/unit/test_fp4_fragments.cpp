// The nvfp4 row kernel's fragment arithmetic (src/cuda/common/fp4_fragments.hpp)
// replayed on the CPU with the PTX layouts of ldmatrix (.x4, .trans) and
// mma.m16n8k16: the raw e2m1 codes are converted in registers (bf16 MMA:
// e2m1x8_to_pairs; fp16 MMA: e2m1x8_to_f16_high_bytes, values times 2^-14,
// scales times 2^7, probabilities times 2^7), scaled by their e4m3 group
// scales, and the warp's QK^T (times 2^-7 on fp16) and PV must equal the plain
// products exactly, for every key, query row and dim, with bf16 and with fp16
// as the MMA type. All values are dyadic rationals of few bits, so double
// accumulation is exact.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/fp4_fragments.hpp"
#include "warp_mma_emulation.hpp"
#include "msa/numeric.hpp"

namespace {

namespace f = msa::cuda::fp4f;

constexpr int kKeys = 128, kDim = 128, kRows = 16, kGroups = kDim / 16;
constexpr int kPlaneBytes = f::kScaleOffset + kKeys * kGroups;

// IEEE half (fp16) bits -> value, subnormals included.
double fp16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0x1F) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(double(m), -24);
  else v = std::ldexp(double(1024 + m), e - 25);
  return (h & 0x8000u) ? -v : v;
}

// A 16-bit value of the MMA type: bf16 is the top half of a float, fp16 IEEE half.
template <bool kF16>
double half_value(std::uint16_t h) {
  if constexpr (kF16) return fp16_value(h);
  else return double(msa::num::bf16_to_float(h));
}
template <bool kF16>
double lo_half(std::uint32_t w) { return half_value<kF16>(std::uint16_t(w & 0xFFFFu)); }
template <bool kF16>
double hi_half(std::uint32_t w) { return half_value<kF16>(std::uint16_t(w >> 16)); }

// Whether x is exactly a value of the MMA type (so that the kernel's 16-bit
// scale multiply does not round).
template <bool kF16>
bool representable(double x) {
  if constexpr (kF16) return fp16_value(msa::num::float_to_fp16(float(x))) == x;
  else return double(msa::num::bf16_to_float(msa::num::float_to_bf16(float(x)))) == x;
}

// One slot of a raw stage: [128 keys][64 data bytes] swizzled by raw_offset,
// then [128 keys][8 e4m3 scales]. codes[key * 128 + dim] are e2m1 codes,
// scales[key * 8 + group] e4m3 bytes.
std::vector<std::uint8_t> make_plane(const std::vector<int>& codes, const std::vector<int>& scales) {
  std::vector<std::uint8_t> plane(kPlaneBytes, 0);
  for (int k = 0; k < kKeys; ++k) {
    for (int i = 0; i < kDim / 2; ++i)
      plane[std::size_t(f::raw_offset(k, i / 16) + i % 16)] =
          std::uint8_t(codes[std::size_t(k * kDim + 2 * i)] | (codes[std::size_t(k * kDim + 2 * i + 1)] << 4));
    for (int g = 0; g < kGroups; ++g)
      plane[std::size_t(f::kScaleOffset + kGroups * k + g)] = std::uint8_t(scales[std::size_t(k * kGroups + g)]);
  }
  return plane;
}

// The reference value of (key, dim): e2m1(code) * e4m3(scale of dim / 16).
double ref_value(const std::vector<int>& codes, const std::vector<int>& scales, int key, int dim) {
  return double(msa::num::e2m1_to_float(std::uint8_t(codes[std::size_t(key * kDim + dim)]))) *
         double(msa::num::e4m3_to_float(std::uint8_t(scales[std::size_t(key * kGroups + dim / 16)])));
}

// The scale of (key, group) as the kernel reads it from the plane.
double plane_scale(const std::vector<std::uint8_t>& plane, int key, int group) {
  return double(msa::num::e4m3_to_float(plane[std::size_t(f::kScaleOffset + kGroups * key + group)]));
}

std::uint32_t load_u32(const std::uint8_t* p) {
  return std::uint32_t(p[0]) | (std::uint32_t(p[1]) << 8) | (std::uint32_t(p[2]) << 16) | (std::uint32_t(p[3]) << 24);
}

using AFrag = msa::test::AFragment<double>;
using BFrag = msa::test::BFragment<double>;
using CFrag = msa::test::CFragment<double>;
void mma(CFrag& c, const AFrag& a, const BFrag& b) { msa::test::warp_mma(c, a, b); }

// A random e2m1 code, never negative zero (8).
int random_code(std::mt19937& rng) {
  std::uniform_int_distribution<int> code(0, 14);
  const int c = code(rng);
  return c >= 8 ? c + 1 : c;
}

// Random positive finite e4m3 scales in [2^-9, 448] (bytes 0x01 .. 0x7E); the
// keys 5 mod 16 get subnormal scales (0x01 .. 0x07) in every group.
std::vector<int> random_scales(std::mt19937& rng) {
  std::uniform_int_distribution<int> normal(0x01, 0x7E), subnormal(0x01, 0x07);
  std::vector<int> s(kKeys * kGroups);
  for (int k = 0; k < kKeys; ++k)
    for (int g = 0; g < kGroups; ++g) s[std::size_t(k * kGroups + g)] = (k % 16 == 5) ? subnormal(rng) : normal(rng);
  return s;
}

template <bool kF16>
void check_warp_products(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3), prob(0, 3);
  std::vector<int> kc(kKeys * kDim), vc(kKeys * kDim), q(kRows * kDim), p(kRows * kKeys);
  for (int& x : kc) x = random_code(rng);
  for (int& x : vc) x = random_code(rng);
  const std::vector<int> ks_ = random_scales(rng), vs = random_scales(rng);
  for (int& x : q) x = small(rng);
  for (int& x : p) x = prob(rng);
  const auto kplane = make_plane(kc, ks_), vplane = make_plane(vc, vs);

  // The query tile as staged: word m of k-step 2c + h from word q_source_word(h, m) of chunk c.
  std::vector<double> qp(kRows * kDim);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < 4; ++c)
      for (int h = 0; h < 2; ++h)
        for (int m = 0; m < 8; ++m)
          for (int e = 0; e < 2; ++e)
            qp[std::size_t(r * kDim + 16 * (2 * c + h) + 2 * m + e)] =
                kF16 ? q[std::size_t(r * kDim + 32 * c + 2 * (f::q_source_pair(m) + e) + h)]
                     : q[std::size_t(r * kDim + 32 * c + 2 * f::q_source_word(h, m) + e)];
  auto a_query = [&](int ks) {
    return msa::test::a_fragment<double>([&](int row, int d) { return qp[std::size_t(row * kDim + d)]; }, 16 * ks);
  };

  int inexact = 0;  // scaled 16-bit products that the MMA type could not hold
  auto scaled = [&](double v, double s) {
    const double x = v * s;
    if (!representable<kF16>(x)) ++inexact;
    return x;
  };

  for (int warp = 0; warp < 4; ++warp) {
    const int key_base = 32 * warp;
    // ---- S = Q K^T: 4 n-tiles of 8 keys; one ldmatrix.x4 per n-tile covers all 8 k-steps.
    CFrag s[4] = {};
    for (int nt = 0; nt < 4; ++nt) {
      const auto r = msa::test::ldmatrix_x4(kplane, [&](int l) {
        int key = 0, chunk = 0;
        f::k_source(l, key_base, nt, key, chunk);
        return f::raw_offset(key, chunk);
      }, false);
      for (int m = 0; m < 4; ++m) {
        BFrag b_even{}, b_odd{};  // k-steps 2m and 2m + 1
        for (int l = 0; l < 32; ++l) {
          const int key = key_base + 8 * nt + l / 4;  // the lane's B column
          const std::uint8_t* sp = kplane.data() + f::kScaleOffset + kGroups * key;
          const std::uint32_t sb = f::scale_bytes(load_u32(sp), load_u32(sp + 4), (l % 4) >> 1);
          const std::uint8_t sbyte = std::uint8_t((sb >> (8 * m)) & 0xFFu);
          EXPECT_EQ(int(sbyte), ks_[std::size_t(key * kGroups + 2 * m + (l % 4) / 2)]) << "scale_bytes lane " << l << " m " << m;
          const double sc = double(msa::num::e4m3_to_float(sbyte)) * (kF16 ? 128.0 : 1.0);
          std::uint32_t pairs[4];
          const std::uint32_t word = msa::test::reg_word(r[std::size_t(l)][std::size_t(m)]);
          if constexpr (kF16) {
            std::uint32_t even = 0, odd = 0;
            f::e2m1x8_to_f16_high_bytes(word, even, odd);
            pairs[0] = f::prmt(even, 0u, f::kHigh01);
            pairs[1] = f::prmt(even, 0u, f::kHigh23);
            pairs[2] = f::prmt(odd, 0u, f::kHigh01);
            pairs[3] = f::prmt(odd, 0u, f::kHigh23);
          } else {
            f::e2m1x8_to_pairs<kF16>(word, pairs);
          }
          b_even[std::size_t(l)] = {scaled(lo_half<kF16>(pairs[0]), sc), scaled(hi_half<kF16>(pairs[0]), sc),
                                    scaled(lo_half<kF16>(pairs[1]), sc), scaled(hi_half<kF16>(pairs[1]), sc)};
          b_odd[std::size_t(l)] = {scaled(lo_half<kF16>(pairs[2]), sc), scaled(hi_half<kF16>(pairs[2]), sc),
                                   scaled(lo_half<kF16>(pairs[3]), sc), scaled(hi_half<kF16>(pairs[3]), sc)};
        }
        mma(s[nt], a_query(2 * m), b_even);
        mma(s[nt], a_query(2 * m + 1), b_odd);
      }
    }
    const std::string mma_type = kF16 ? "fp16" : "bf16";
    ASSERT_NO_FATAL_FAILURE(msa::test::expect_accumulators(s, [&](int nt, int row, int column) {
      const int key = key_base + 8 * nt + column;
      double want = 0;
      for (int d = 0; d < kDim; ++d) want += double(q[std::size_t(row * kDim + d)]) * ref_value(kc, ks_, key, d);
      return kF16 ? std::ldexp(want, -7) : want;
    }, mma_type + " S, warp " + std::to_string(warp)));

    // ---- O = P V: the probabilities in the score accumulators' layout, 2 k-steps, 16 n-tiles.
    CFrag o[16] = {};
    for (int kk = 0; kk < 2; ++kk) {
      const AFrag a = msa::test::a_fragment<double>(
          [&](int row, int key) { return double(p[std::size_t(row * kKeys + key)]) * (kF16 ? 128.0 : 1.0); },
          key_base + 16 * kk);
      for (int cp = 0; cp < 2; ++cp) {
        const auto r = msa::test::ldmatrix_x4(vplane, [&](int l) {
          int key = 0, chunk = 0;
          f::v_source(l, key_base, kk, cp, key, chunk);
          return f::raw_offset(key, chunk);
        }, true);
        for (int cc = 0; cc < 2; ++cc) {
          const int chunk = 2 * cp + cc;
          BFrag b[4] = {};  // n-tiles 4 chunk + e
          for (int l = 0; l < 32; ++l) {
            const int k0 = key_base + 16 * kk + 2 * (l % 4), group = 2 * chunk + (l >> 4);
            const std::uint32_t w0 = msa::test::reg_word(r[std::size_t(l)][std::size_t(2 * cc)]);
            const std::uint32_t w1 = msa::test::reg_word(r[std::size_t(l)][std::size_t(2 * cc + 1)]);
            const double vscale = kF16 ? 128.0 : 1.0;
            for (int e = 0; e < 4; ++e) {
              std::uint32_t b0 = 0, b1 = 0;
              if constexpr (kF16) {
                std::uint32_t even0 = 0, odd0 = 0, even1 = 0, odd1 = 0;
                f::e2m1x8_to_f16_high_bytes(w0, even0, odd0);
                f::e2m1x8_to_f16_high_bytes(w1, even1, odd1);
                const std::uint32_t sel = e < 2 ? f::kHigh02 : f::kHigh13;
                b0 = f::prmt((e & 1) ? odd0 : even0, 0u, sel);
                b1 = f::prmt((e & 1) ? odd1 : even1, 0u, sel);
              } else {
                std::uint32_t p0[4], p1[4];
                f::e2m1x8_to_pairs<kF16>(w0, p0);
                f::e2m1x8_to_pairs<kF16>(w1, p1);
                const std::uint32_t sel = (e & 1) ? f::kPairHigh : f::kPairLow;
                b0 = f::prmt(p0[e / 2], p0[2 + e / 2], sel);
                b1 = f::prmt(p1[e / 2], p1[2 + e / 2], sel);
              }
              b[e][std::size_t(l)] = {scaled(lo_half<kF16>(b0), vscale * plane_scale(vplane, k0, group)),
                                      scaled(hi_half<kF16>(b0), vscale * plane_scale(vplane, k0 + 1, group)),
                                      scaled(lo_half<kF16>(b1), vscale * plane_scale(vplane, k0 + 8, group)),
                                      scaled(hi_half<kF16>(b1), vscale * plane_scale(vplane, k0 + 9, group))};
            }
          }
          for (int e = 0; e < 4; ++e) mma(o[4 * chunk + e], a, b[e]);
        }
      }
    }
    ASSERT_NO_FATAL_FAILURE(msa::test::expect_accumulators(o, [&](int t, int row, int column) {
      const int dim = f::out_dim(t, column / 2, column & 1);
      double want = 0;
      for (int k = key_base; k < key_base + 32; ++k) want += double(p[std::size_t(row * kKeys + k)]) * ref_value(vc, vs, k, dim);
      return want;
    }, mma_type + " O, warp " + std::to_string(warp)));
  }
  EXPECT_EQ(inexact, 0) << "scaled values not exact in " << (kF16 ? "fp16" : "bf16");
}

// Calls check(w) on words holding every code in every nibble position against
// several backgrounds, then on 100,000 random words; stops at a fatal failure.
template <class Check>
void for_test_words(std::uint32_t seed, const Check& check) {
  for (int j = 0; j < 8; ++j)
    for (std::uint32_t c = 0; c < 16; ++c)
      for (std::uint32_t bg = 0; bg < 16; ++bg) {
        std::uint32_t w = 0;
        for (int i = 0; i < 8; ++i) w |= ((i == j ? c : (bg + std::uint32_t(i)) & 0xFu) << (4 * i));
        check(w);
        if (::testing::Test::HasFatalFailure()) return;
      }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> any(0u, 0xFFFFFFFFu);
  for (int n = 0; n < 100000; ++n) {
    check(any(rng));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

template <bool kF16>
void check_conversion() {
  const std::uint32_t seed = kF16 ? 7u : 11u;
  auto check_word = [](std::uint32_t w) {
    std::uint32_t out[4];
    f::e2m1x8_to_pairs<kF16>(w, out);
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * i + h;
        const std::uint8_t code = std::uint8_t((w >> (4 * j)) & 0xFu);
        const double got = h ? hi_half<kF16>(out[i]) : lo_half<kF16>(out[i]);
        ASSERT_EQ(got, double(msa::num::e2m1_to_float(code)))
            << (kF16 ? "fp16" : "bf16") << " word 0x" << std::hex << w << std::dec << " element " << j;
      }
  };
  for_test_words(seed, check_word);
}

// e2m1x8_to_f16_high_bytes and the kHigh selectors: every element's fp16
// value is its e2m1 value times 2^-14.
TEST(Fp4Fragments, ScaledFp16HighBytes) {
  auto check_word = [](std::uint32_t w) {
    std::uint32_t even = 0, odd = 0;
    f::e2m1x8_to_f16_high_bytes(w, even, odd);
    // (selector, bytes, the elements of its low and high half)
    const struct { std::uint32_t sel; bool odd; int lo, hi; } pairs[] = {
        {f::kHigh01, false, 0, 2}, {f::kHigh23, false, 4, 6}, {f::kHigh02, false, 0, 4}, {f::kHigh13, false, 2, 6},
        {f::kHigh01, true, 1, 3},  {f::kHigh23, true, 5, 7},  {f::kHigh02, true, 1, 5},  {f::kHigh13, true, 3, 7}};
    for (const auto& pr : pairs) {
      const std::uint32_t x = f::prmt(pr.odd ? odd : even, 0u, pr.sel);
      for (int h = 0; h < 2; ++h) {
        const int j = h ? pr.hi : pr.lo;
        const std::uint8_t code = std::uint8_t((w >> (4 * j)) & 0xFu);
        const double got = h ? hi_half<true>(x) : lo_half<true>(x);
        ASSERT_EQ(got, std::ldexp(double(msa::num::e2m1_to_float(code)), -14))
            << "word 0x" << std::hex << w << std::dec << " element " << j;
      }
    }
  };
  for_test_words(13u, check_word);
}

TEST(Fp4Fragments, ConversionBf16) { check_conversion<false>(); }
TEST(Fp4Fragments, ConversionFp16) { check_conversion<true>(); }

TEST(Fp4Fragments, Fp16DecoderMatchesNumeric) {
  // The test's own fp16 decoder agrees with msa::num on every finite half.
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    if (((h >> 10) & 0x1Fu) == 0x1Fu) continue;
    ASSERT_EQ(fp16_value(std::uint16_t(h)), double(msa::num::fp16_to_float(std::uint16_t(h)))) << "half 0x" << std::hex << h;
  }
}

TEST(Fp4Fragments, PermutationsAreBijective) {
  // q_source_word: a permutation of the 8 words of each half, the two halves
  // together cover the 16 words of a 32-dim chunk once.
  std::array<int, 16> all{};
  for (int h = 0; h < 2; ++h) {
    std::array<int, 16> seen{};
    for (int m = 0; m < 8; ++m) {
      const int w = f::q_source_word(h, m);
      ASSERT_GE(w, 0);
      ASSERT_LT(w, 16);
      ++seen[std::size_t(w)];
      ++all[std::size_t(w)];
    }
    int distinct = 0;
    for (int n : seen) {
      EXPECT_LE(n, 1);
      distinct += n;
    }
    EXPECT_EQ(distinct, 8);
  }
  for (int n : all) EXPECT_EQ(n, 1);
  // q_source_pair: words m of a half take the pairs (w, w + 1) of the 16
  // words once each (m < 4 the first of four, m >= 4 the second).
  std::array<int, 16> paired{};
  for (int m = 0; m < 8; ++m) {
    const int w = f::q_source_pair(m);
    ASSERT_GE(w, 0);
    ASSERT_LT(w + 1, 16);
    ++paired[std::size_t(w)];
    ++paired[std::size_t(w + 1)];
  }
  for (int n : paired) EXPECT_EQ(n, 1);
  // Output dims: every (n-tile, lane quad position, element) once.
  std::vector<int> dims(kDim, 0);
  for (int t = 0; t < 16; ++t)
    for (int q = 0; q < 4; ++q)
      for (int e = 0; e < 2; ++e) {
        const int d = f::out_dim(t, q, e);
        ASSERT_GE(d, 0);
        ASSERT_LT(d, kDim);
        ++dims[std::size_t(d)];
      }
  for (int d : dims) EXPECT_EQ(d, 1);
}

TEST(Fp4Fragments, WarpProductsAreExactBf16) { check_warp_products<false>(20261201u); }
TEST(Fp4Fragments, WarpProductsAreExactFp16) { check_warp_products<true>(20261202u); }

TEST(Fp4Fragments, LdmatrixRowsAreBankConflictFree) {
  // The 8 row addresses of each matrix fall in 8 different 16-byte bank groups.
  for (int warp = 0; warp < 4; ++warp) {
    const int key_base = 32 * warp;
    for (int nt = 0; nt < 4; ++nt)
      for (int m = 0; m < 4; ++m) {
        std::array<int, 8> groups{};
        for (int r = 0; r < 8; ++r) {
          int key = 0, chunk = 0;
          f::k_source(8 * m + r, key_base, nt, key, chunk);
          ++groups[std::size_t((f::raw_offset(key, chunk) / 16) % 8)];
        }
        for (int n : groups) EXPECT_EQ(n, 1) << "K warp " << warp << " n-tile " << nt << " matrix " << m;
      }
    for (int kk = 0; kk < 2; ++kk)
      for (int cp = 0; cp < 2; ++cp)
        for (int m = 0; m < 4; ++m) {
          std::array<int, 8> groups{};
          for (int r = 0; r < 8; ++r) {
            int key = 0, chunk = 0;
            f::v_source(8 * m + r, key_base, kk, cp, key, chunk);
            ++groups[std::size_t((f::raw_offset(key, chunk) / 16) % 8)];
          }
          for (int n : groups) EXPECT_EQ(n, 1) << "V warp " << warp << " kk " << kk << " cp " << cp << " matrix " << m;
        }
  }
}

TEST(Fp4Fragments, RawOffsetsTileThePlane) {
  // Every (key, chunk) gets its own 16-byte slot inside the key's 64-byte row.
  std::vector<int> used(f::kScaleOffset / 16, 0);
  for (int k = 0; k < kKeys; ++k)
    for (int c = 0; c < 4; ++c) {
      const int off = f::raw_offset(k, c);
      ASSERT_EQ(off % 16, 0);
      ASSERT_EQ(off / 64, k);
      ++used[std::size_t(off / 16)];
    }
  for (int n : used) EXPECT_EQ(n, 1);
}

TEST(Fp4Fragments, PrmtHostEmulation) {
  const std::uint32_t a = 0x33221100u, b = 0x77665544u;
  EXPECT_EQ(f::prmt(a, b, 0x3210u), a);
  EXPECT_EQ(f::prmt(a, b, 0x7654u), b);
  EXPECT_EQ(f::prmt(a, b, 0x0123u), 0x00112233u);
  EXPECT_EQ(f::prmt(a, b, f::kPairLow), 0x55441100u);
  EXPECT_EQ(f::prmt(a, b, f::kPairHigh), 0x77663322u);
  EXPECT_EQ(f::prmt(a, b, 0x5140u), 0x55114400u);
  EXPECT_EQ(f::prmt(a, b, 0x4444u), 0x44444444u);
  // scale_bytes: byte c is group 2c + odd.
  EXPECT_EQ(f::scale_bytes(0x03020100u, 0x07060504u, 0), 0x06040200u);
  EXPECT_EQ(f::scale_bytes(0x03020100u, 0x07060504u, 1), 0x07050301u);
}

}  // namespace
