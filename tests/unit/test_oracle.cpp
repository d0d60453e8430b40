// The test support library itself: the float64 oracle on cases with a closed
// form, the comparison rules, and the cache reader on hand-written bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cache_reader.hpp"
#include "compare.hpp"
#include "msa/cache.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "oracle.hpp"

namespace {

constexpr int D = 128;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

std::vector<double> random_rows(int rows, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> x(std::size_t(rows) * D);
  for (auto& e : x) e = nd(rng);
  return x;
}

double dot(const double* a, const double* b) {
  double s = 0.0;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// ---- oracle ---------------------------------------------------------------------

TEST(Oracle, OneKeyGivesItsValue) {
  std::mt19937 rng(1);
  const auto q = random_rows(1, rng), k = random_rows(3, rng), v = random_rows(3, rng);
  const std::uint8_t mask[3] = {0, 1, 0};
  std::vector<double> out(D);
  double lse = 0.0;
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 1, 3, 0.3, out.data(), &lse);
  for (int d = 0; d < D; ++d) EXPECT_DOUBLE_EQ(out[d], v[D + d]);
  EXPECT_NEAR(lse, 0.3 * dot(q.data(), k.data() + D), 1e-12);
}

TEST(Oracle, TwoKeysClosedForm) {
  std::mt19937 rng(2);
  const auto q = random_rows(1, rng), k = random_rows(2, rng), v = random_rows(2, rng);
  const std::uint8_t mask[2] = {1, 1};
  const double scale = 0.125;
  const double s0 = scale * dot(q.data(), k.data()), s1 = scale * dot(q.data(), k.data() + D);
  const double w0 = std::exp(s0) / (std::exp(s0) + std::exp(s1));
  std::vector<double> out(D);
  double lse = 0.0;
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 1, 2, scale, out.data(), &lse);
  for (int d = 0; d < D; ++d) EXPECT_NEAR(out[d], w0 * v[d] + (1 - w0) * v[D + d], 1e-12);
  EXPECT_NEAR(lse, std::log(std::exp(s0) + std::exp(s1)), 1e-12);
}

TEST(Oracle, EmptyRowIsZeroAndMinusInf) {
  std::mt19937 rng(3);
  const auto q = random_rows(2, rng), k = random_rows(4, rng), v = random_rows(4, rng);
  const std::uint8_t mask[8] = {0, 0, 0, 0, 1, 0, 0, 0};
  std::vector<double> out(2 * D, kNan);
  double lse[2] = {kNan, kNan};
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 2, 4, 1.0, out.data(), lse);
  for (int d = 0; d < D; ++d) EXPECT_EQ(out[d], 0.0);
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_TRUE(std::isfinite(lse[1]));
  // No keys at all.
  msa::ref::masked_attention(q.data(), k.data(), v.data(), nullptr, 1, 0, 1.0, out.data(), lse);
  EXPECT_EQ(lse[0], -kInf);
  EXPECT_EQ(out[5], 0.0);
}

// Hidden keys are never read; a NaN in a visible key spreads to its row.
TEST(Oracle, MaskHidesKeysAndNanPropagates) {
  std::mt19937 rng(4);
  const auto q = random_rows(1, rng);
  auto k = random_rows(3, rng), v = random_rows(3, rng);
  const std::uint8_t mask[3] = {1, 0, 1};
  std::vector<double> a(D), b(D);
  double la = 0.0, lb = 0.0;
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 1, 3, 0.1, a.data(), &la);
  k[D + 7] = kNan;
  v[D + 9] = kInf;
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 1, 3, 0.1, b.data(), &lb);
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  k[2 * D + 1] = kNan;
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 1, 3, 0.1, b.data(), &lb);
  EXPECT_TRUE(std::isnan(b[0]));
  EXPECT_TRUE(std::isnan(lb));
}

// Logits of several hundred do not overflow; the weights match the closed form.
TEST(Oracle, LargeLogitsStayFinite) {
  std::vector<double> q(D, 0.0), k(2 * D, 0.0), v(2 * D, 0.0);
  q[0] = 30.0;
  k[0] = 30.0;        // logit 900
  k[D] = 30.0 - 1.0 / 30.0;  // logit 899
  v[1] = 1.0;
  v[D + 1] = -1.0;
  const std::uint8_t mask[2] = {1, 1};
  std::vector<double> out(D);
  double lse = 0.0;
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask, 1, 2, 1.0, out.data(), &lse);
  const double w0 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_NEAR(out[1], w0 - (1 - w0), 1e-12);
  EXPECT_NEAR(lse, 900.0 + std::log(1.0 + std::exp(-1.0)), 1e-9);
}

TEST(Oracle, CausalEqualsExplicitMask) {
  std::mt19937 rng(5);
  const int nq = 37, nk = 300, first = nk - nq;
  const auto q = random_rows(nq, rng), k = random_rows(nk, rng), v = random_rows(nk, rng);
  std::vector<std::uint8_t> mask(std::size_t(nq) * nk);
  for (int i = 0; i < nq; ++i)
    for (int j = 0; j < nk; ++j) mask[std::size_t(i) * nk + j] = j <= first + i;
  std::vector<double> a(std::size_t(nq) * D), b(a.size()), la(nq), lb(nq);
  msa::ref::masked_attention(q.data(), k.data(), v.data(), mask.data(), nq, nk, 0.088, a.data(), la.data());
  msa::ref::causal_attention(q.data(), k.data(), v.data(), nq, nk, first, 0.088, b.data(), lb.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
}

// ---- compare --------------------------------------------------------------------

TEST(Compare, ErrorsAndWorstElement) {
  const std::vector<double> want = {3.0, 4.0, 0.0};
  const auto same = msa::ref::compare(want, want);
  EXPECT_EQ(same.rel_frobenius, 0.0);
  EXPECT_TRUE(same.rel_ok(0.0));
  const auto c = msa::ref::compare({3.0, 4.5, -0.1}, want);
  EXPECT_NEAR(c.rel_frobenius, std::sqrt(0.25 + 0.01) / 5.0, 1e-15);
  EXPECT_DOUBLE_EQ(c.max_abs, 0.5);
  EXPECT_EQ(c.worst, 1);
  EXPECT_EQ(c.worst_got, 4.5);
  EXPECT_EQ(c.worst_want, 4.0);
  EXPECT_FALSE(c.rel_ok(0.05));
  EXPECT_TRUE(c.rel_ok(0.2));
  EXPECT_NE(c.describe().find("at [1] got 4.5 want 4"), std::string::npos) << c.describe();
  // An all-zero reference falls back to the absolute norm.
  const auto z = msa::ref::compare({0.0, 0.3}, {0.0, 0.0});
  EXPECT_NEAR(z.rel_frobenius, 0.3, 1e-15);
  EXPECT_THROW(msa::ref::compare({1.0}, {1.0, 2.0}), msa::Error);
}

TEST(Compare, RowsAreBoundedOneByOne) {
  // Row 0 is large and exact, row 1 small and 10% off: over the whole output
  // the error hides (0.1 * 0.1 / 100), row by row it shows.
  const std::vector<double> want = {100.0, 0.0, 0.1, 0.0};
  const std::vector<double> got = {100.0, 0.0, 0.11, 0.0};
  EXPECT_LT(msa::ref::compare(got, want).rel_frobenius, 1e-3);
  const auto r = msa::ref::compare_rows(got, want, 2);
  EXPECT_NEAR(r.rel_frobenius, 0.1, 1e-12);
  EXPECT_EQ(r.worst_row, 1);
  EXPECT_EQ(r.worst, 2);
  EXPECT_FALSE(r.rel_ok(1e-2));
  EXPECT_NE(r.describe().find("(worst row 1)"), std::string::npos) << r.describe();
  EXPECT_EQ(msa::ref::compare_rows(want, want, 4).rel_frobenius, 0.0);
  EXPECT_THROW(msa::ref::compare_rows(got, want, 3), msa::Error);
  // A non-finite mismatch in any row fails the comparison.
  EXPECT_FALSE(msa::ref::compare_rows({1.0, kNan}, {1.0, 1.0}, 1).rel_ok(1e9));
}

TEST(Compare, NonFiniteMustSitInTheSamePlaces) {
  const auto ok = msa::ref::compare({kNan, kInf, -kInf, 1.0}, {kNan, kInf, -kInf, 1.0});
  EXPECT_EQ(ok.mismatches, 0);
  EXPECT_TRUE(ok.rel_ok(0.0));
  const auto nan_got = msa::ref::compare({1.0, kNan}, {1.0, 2.0});
  EXPECT_EQ(nan_got.mismatches, 1);
  EXPECT_EQ(nan_got.first_mismatch, 1);
  EXPECT_FALSE(nan_got.rel_ok(1e9));
  EXPECT_NE(nan_got.describe().find("non-finite"), std::string::npos) << nan_got.describe();
  EXPECT_FALSE(msa::ref::compare({1.0, 2.0}, {1.0, kNan}).rel_ok(1e9));
  EXPECT_FALSE(msa::ref::compare({-kInf}, {kInf}).rel_ok(1e9));
  EXPECT_FALSE(msa::ref::compare({kNan}, {kInf}).rel_ok(1e9));
}

TEST(Compare, LseMinusInfMatchesExactly) {
  EXPECT_TRUE(msa::ref::compare_lse({-kInf, 1.0005}, {-kInf, 1.0}).abs_ok(1e-3));
  EXPECT_FALSE(msa::ref::compare_lse({-kInf, 1.0}, {-30.0, 1.0}).abs_ok(1e9));
  EXPECT_FALSE(msa::ref::compare_lse({-1e30, 1.0}, {-kInf, 1.0}).abs_ok(1e9));
  EXPECT_FALSE(msa::ref::compare_lse({kNan}, {0.0}).abs_ok(1e9));
  EXPECT_FALSE(msa::ref::compare_lse({1.0}, {1.002}).abs_ok(1e-3));
}

// ---- cache reader -----------------------------------------------------------------

TEST(CacheReader, Elements) {
  const std::uint16_t bf[2] = {0x3F80, 0xC040};  // 1, -3
  const std::uint16_t hf[2] = {0x3C00, 0x3555};  // 1, 0.333...
  const std::uint8_t e4[2] = {0x38, 0x7F};       // 1, NaN
  const std::uint8_t e5[2] = {0x3C, 0x7C};       // 1, inf
  const float f[1] = {2.5f};
  EXPECT_EQ(msa::ref::read_element(bf, msa::DType::bf16, 1), -3.0);
  EXPECT_EQ(msa::ref::read_element(hf, msa::DType::fp16, 0), 1.0);
  EXPECT_NEAR(msa::ref::read_element(hf, msa::DType::fp16, 1), 1.0 / 3, 1e-3);
  EXPECT_EQ(msa::ref::read_element(e4, msa::DType::fp8_e4m3, 0), 1.0);
  EXPECT_TRUE(std::isnan(msa::ref::read_element(e4, msa::DType::fp8_e4m3, 1)));
  EXPECT_EQ(msa::ref::read_element(e5, msa::DType::fp8_e5m2, 0), 1.0);
  EXPECT_EQ(msa::ref::read_element(e5, msa::DType::fp8_e5m2, 1), kInf);
  EXPECT_EQ(msa::ref::read_element(f, msa::DType::f32, 0), 2.5);
  EXPECT_EQ(msa::ref::read_array(bf, msa::DType::bf16, 2, 0.5), (std::vector<double>{0.5, -1.5}));
  EXPECT_THROW(msa::ref::read_element(f, msa::DType::i32, 0), msa::Error);

  msa::AttentionArgs a;
  a.q_dtype = msa::DType::fp8_e4m3;
  a.q_scale = 0.25f;
  a.num_q_heads = 1;
  std::vector<std::uint8_t> qq(D, 0x38);  // e4m3 1
  qq[1] = 0xB8;                           // e4m3 -1
  a.q = qq.data();
  const auto qd = msa::ref::read_query(a, 1);
  EXPECT_EQ(qd[0], 0.25);
  EXPECT_EQ(qd[1], -0.25);
}

// Logical position j of request 0 holds value code(j, head, d, is_v) in bf16,
// whatever the physical order; pages are shuffled through the block table.
TEST(CacheReader, Bf16EveryLayout) {
  const int H = 3, seq = 300, pages = 5;
  const std::int32_t table[3] = {4, 0, 2};
  const msa::BlockTable bt{table, 1, 3, 3};
  auto value = [](int j, int h, int d, int is_v) { return float((j * 7 + h * 3 + d + 1000 * is_v) % 251 - 125); };
  for (msa::Layout l : {msa::Layout::hnd, msa::Layout::nhd, msa::Layout::split}) {
    for (std::int64_t extra : {0, 1000}) {
      SCOPED_TRACE(std::string(msa::layout_name(l)) + " extra " + std::to_string(extra));
      const std::int64_t stride = std::int64_t(H) * 128 * 256 + extra;
      std::vector<std::uint16_t> mem(std::size_t(stride * pages), 0x7FFF);
      const msa::KVCacheView c = msa::make_cache_view(msa::DType::bf16, mem.data(), pages, H, l, stride);
      for (int j = 0; j < seq; ++j)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < D; ++d) {
            const std::int64_t at = c.offset(table[j / 128], h, j % 128, d);
            static_cast<std::uint16_t*>(c.k)[at] = msa::num::float_to_bf16(value(j, h, d, 0));
            static_cast<std::uint16_t*>(c.v)[at] = msa::num::float_to_bf16(value(j, h, d, 1));
          }
      for (int h = 0; h < H; ++h) {
        const auto kv = msa::ref::read_kv(c, bt, 0, h, seq);
        for (int j = 0; j < seq; ++j)
          for (int d = 0; d < D; ++d) {
            ASSERT_EQ(kv.k[std::size_t(j) * D + d], value(j, h, d, 0)) << "j " << j << " h " << h;
            ASSERT_EQ(kv.v[std::size_t(j) * D + d], value(j, h, d, 1)) << "j " << j << " h " << h;
          }
      }
    }
  }
}

TEST(CacheReader, Fp8Scales) {
  const int H = 2, pages = 2;
  std::vector<std::uint8_t> mem(std::size_t(pages) * H * 128 * 256, 0x38);  // every code 1.0
  msa::KVCacheView c = msa::make_cache_view(msa::DType::fp8_e4m3, mem.data(), pages, H, msa::Layout::hnd);
  c.k_scale = 0.5f;
  c.v_scale = 4.0f;
  const std::int32_t table[1] = {1};
  const msa::BlockTable bt{table, 1, 1, 1};
  auto kv = msa::ref::read_kv(c, bt, 0, 1, 5);
  EXPECT_EQ(kv.k[3], 0.5);
  EXPECT_EQ(kv.v[200], 4.0);
  std::vector<float> ks(std::size_t(pages) * 128 * H, 1.0f), vs(ks.size(), 1.0f);
  ks[c.scale_index(1, 1, 3)] = 0.125f;  // token 3 of page 1, head 1
  vs[c.scale_index(1, 0, 3)] = 8.0f;    // same token, head 0: must not show in head 1
  c.scale_mode = msa::ScaleMode::per_token_head;
  c.k_scales = ks.data();
  c.v_scales = vs.data();
  kv = msa::ref::read_kv(c, bt, 0, 1, 5);
  EXPECT_EQ(kv.k[3 * D + 17], 0.125);
  EXPECT_EQ(kv.k[2 * D + 17], 1.0);
  EXPECT_EQ(kv.v[3 * D + 17], 1.0);
}

// One hand-packed nvfp4 token (contract 4.3).
TEST(CacheReader, Nvfp4Token) {
  const int H = 2, pages = 3;
  std::vector<std::uint8_t> mem(std::size_t(pages) * 2 * H * msa::nvfp4::kSlotBytes, 0);
  const msa::KVCacheView c = msa::make_nvfp4_cache_view(mem.data(), pages, H, 0.25f, 0.5f);
  const std::int64_t page = 2, head = 1, token = 5;
  std::uint8_t* ks = mem.data() + msa::nvfp4::slot_offset(c, page, head, 0);
  std::uint8_t* vs = mem.data() + msa::nvfp4::slot_offset(c, page, head, 1);
  ks[msa::nvfp4::data_offset(token, 0)] = 0x21;   // elements 0, 1: codes 1 (0.5), 2 (1.0)
  ks[msa::nvfp4::data_offset(token, 8)] = 0xB7;   // elements 16, 17: codes 7 (6), 0xB (-1.5)
  ks[msa::nvfp4::scale_offset(token, 0)] = 0x38;  // group 0 scale 1
  ks[msa::nvfp4::scale_offset(token, 1)] = 0x40;  // group 1 scale 2
  vs[msa::nvfp4::data_offset(token, 63)] = 0x90;  // element 126: 0, element 127: code 9 (-0.5)
  vs[msa::nvfp4::scale_offset(token, 7)] = 0x30;  // group 7 scale 0.5
  const std::int32_t table[2] = {0, 2};
  const msa::BlockTable bt{table, 1, 2, 2};
  const auto kv = msa::ref::read_kv(c, bt, 0, 1, 128 + token + 1);
  const double* k = kv.k.data() + (128 + token) * D;
  const double* v = kv.v.data() + (128 + token) * D;
  EXPECT_EQ(k[0], 0.5 * 1 * 0.25);
  EXPECT_EQ(k[1], 1.0 * 1 * 0.25);
  EXPECT_EQ(k[16], 6.0 * 2 * 0.25);
  EXPECT_EQ(k[17], -1.5 * 2 * 0.25);
  EXPECT_EQ(k[2], 0.0);
  EXPECT_EQ(v[126], 0.0);
  EXPECT_EQ(v[127], -0.5 * 0.5 * 0.5);
}

}  // namespace
