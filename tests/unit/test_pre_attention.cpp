// cpu::pre_attention (contract 10) against the float64 oracle and the inserts:
//  - every head's unquantized value u (fp32 norm + RoPE rounded to the qkv
//    dtype, src/core/pre_attention_math.hpp) is a rounding of the float64
//    norm + RoPE that fp32 arithmetic may give (the nearest one, except where
//    the float64 value lies within the fp32 error bound of a midpoint);
//  - q and index q are u in their dtypes, and the caches hold byte for byte
//    what cpu::insert_kv / insert_index write for source rows u (V: the input),
// for every KV dtype, layout, scale mode, page stride, index dtype, output
// dtype, weight and table dtype, odd token counts, skipped slots, a padded
// qkv row stride; plus every input check and the unchecked skips.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/pre_attention_math.hpp"
#include "cuda/pre_attention/fast_divide.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "msa/pre_attention.hpp"
#include "pre_attention_inputs.hpp"
#include "pre_attention_ref.hpp"

namespace {

using msa::DType;
using msa::Layout;
using msa::ScaleMode;
using msa::test::expect_error;
using std::int64_t;
using std::uint16_t;
using std::uint8_t;

using Case = msa::test::PreAttentionCase;
using Inputs = msa::test::PreAttentionInputs;
using msa::test::make_pre_attention_inputs;

constexpr int D = 128;
constexpr uint8_t kPoison = msa::test::kPreAttentionPoison;

uint16_t encode_half(DType t, float x) {
  return t == DType::bf16 ? msa::num::float_to_bf16(x) : msa::num::float_to_fp16(x);
}
float decode_half(DType t, uint16_t b) {
  return t == DType::bf16 ? msa::num::bf16_to_float(b) : msa::num::fp16_to_float(b);
}

// u of every (token, head): steps 1-3 of the SEMANTICS through the shared
// arithmetic, as float values of the qkv dtype.   returns [tokens, heads, 128]
std::vector<float> unquantized(Inputs& in) {
  const msa::PreAttentionArgs a = in.args();
  const int64_t H = in.heads();
  std::vector<float> u(std::size_t(a.num_tokens * H * D));
  auto load = [](const void* p, DType t, int64_t i) {
    if (t == DType::f32) return static_cast<const float*>(p)[i];
    return decode_half(t, static_cast<const uint16_t*>(p)[i]);
  };
  float w[4][D];
  for (int k = 0; k < 4; ++k)
    for (int d = 0; d < D; ++d) w[k][d] = load(in.weights[k].data(), in.c.weight, d);
  for (int64_t i = 0; i < a.num_tokens; ++i) {
    float cs[msa::kRopeDims];
    for (int d = 0; d < msa::kRopeDims; ++d)
      cs[d] = load(in.cos_sin.data(), in.c.table, in.positions[i] * msa::kRopeDims + d);
    for (int64_t j = 0; j < H; ++j) {
      float x[D], z[D];
      for (int d = 0; d < D; ++d) x[d] = decode_half(in.c.src, in.qkv[std::size_t(i * in.stride() + j * D + d)]);
      const msa::pre::HeadKind kind = msa::pre::head_kind(j, in.c.nq, in.c.nkv, in.c.niq);
      float* out = u.data() + (i * H + j) * D;
      if (kind == msa::pre::HeadKind::v) {
        std::copy(x, x + D, out);
        continue;
      }
      const int k = kind == msa::pre::HeadKind::q ? 0 : kind == msa::pre::HeadKind::k ? 1
                    : kind == msa::pre::HeadKind::index_q ? 2 : 3;
      msa::pre::norm_rope_head(x, w[k], cs, a.eps, z);
      for (int d = 0; d < D; ++d) out[d] = decode_half(in.c.src, encode_half(in.c.src, z[d]));
    }
  }
  return u;
}

std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i])
      return msa::detail::concat("byte ", i, " of ", want.size(), ": got 0x", std::hex, int(got[i]),
                                 " want 0x", int(want[i]));
  return "";
}

// Output row `head` of token i: u in dtype (e4m3: u / scale).   out: bytes
void store_row(const float* u, DType dtype, float scale, uint8_t* out) {
  for (int d = 0; d < D; ++d) {
    if (dtype == DType::fp8_e4m3) {
      out[d] = msa::num::float_to_e4m3(u[d] / scale);
    } else {
      const uint16_t b = encode_half(dtype, u[d]);
      std::memcpy(out + 2 * d, &b, 2);
    }
  }
}

void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  Inputs in = make_pre_attention_inputs(c);
  Inputs want = in;  // the expected outputs start from the same poison
  const int64_t T = c.tokens, H = in.heads();

  msa::cpu::Options opt;
  opt.num_threads = 2;
  msa::cpu::pre_attention(in.view(in.cache.data(), in.k_scales.data(), in.v_scales.data()),
                          in.index_view(in.index_cache.data()), in.args(), opt);

  // u against the float64 oracle.
  const std::vector<float> u = unquantized(want);
  const msa::ref::PreAttentionRef ref = msa::ref::pre_attention_reference(want.args());
  int64_t ambiguous = 0, wrong = 0;
  std::string first_wrong;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < H; ++j)
      for (int d = 0; d < D; ++d) {
        const float x = u[std::size_t((i * H + j) * D + d)];
        ambiguous += ref.ambiguous(i, j, d);
        if (!ref.admits(i, j, d, x) && wrong++ == 0)
          first_wrong = msa::detail::concat("token ", i, " head ", j, " d ", d, ": u ", x, " float64 ",
                                            ref.z[std::size_t(ref.index(i, j, d))], " rounds to ",
                                            ref.rounded(i, j, d));
      }
  EXPECT_EQ(wrong, 0) << first_wrong;
  EXPECT_LT(double(ambiguous), 0.05 * double(T * H * D)) << "the fp32 error bound admits too much";

  // The expected outputs: u stored as the SEMANTICS say, caches through the inserts.
  const int64_t nq = c.nq, nkv = c.nkv, niq = c.niq;
  const msa::PreAttentionArgs wa = want.args();
  std::vector<uint16_t> k_rows(std::size_t(T * nkv * D)), v_rows(k_rows.size()), ik_rows(std::size_t(T * D));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < H; ++j) {
      const float* row = u.data() + (i * H + j) * D;
      switch (msa::pre::head_kind(j, nq, nkv, niq)) {
        case msa::pre::HeadKind::q:
          store_row(row, c.q, wa.q_scale, want.q.data() + (i * nq + j) * D * msa::dtype_bytes(c.q));
          break;
        case msa::pre::HeadKind::index_q:
          store_row(row, c.iq, 1.0f, want.iq.data() + (i * niq + j - nq - 2 * nkv) * D * msa::dtype_bytes(c.iq));
          break;
        case msa::pre::HeadKind::k:
          for (int d = 0; d < D; ++d) k_rows[std::size_t((i * nkv + j - nq) * D + d)] = encode_half(c.src, row[d]);
          break;
        case msa::pre::HeadKind::v:
          for (int d = 0; d < D; ++d)
            v_rows[std::size_t((i * nkv + j - nq - nkv) * D + d)] = encode_half(c.src, row[d]);
          break;
        case msa::pre::HeadKind::index_k:
          for (int d = 0; d < D; ++d) ik_rows[std::size_t(i * D + d)] = encode_half(c.src, row[d]);
          break;
      }
    }
  msa::cpu::insert_kv(want.view(want.cache.data(), want.k_scales.data(), want.v_scales.data()),
                      msa::InsertKVArgs{k_rows.data(), v_rows.data(), c.src, want.slots.data(), T});
  msa::cpu::insert_index(want.index_view(want.index_cache.data()),
                         msa::InsertIndexArgs{ik_rows.data(), c.src,
                                              c.own_index_slots ? want.index_slots.data() : want.slots.data(), T});

  EXPECT_EQ(first_difference(in.q, want.q), "") << "q";
  EXPECT_EQ(first_difference(in.iq, want.iq), "") << "index q";
  EXPECT_EQ(first_difference(in.cache, want.cache), "") << "KV cache";
  EXPECT_EQ(first_difference(in.index_cache, want.index_cache), "") << "index cache";
  if (c.scales == ScaleMode::per_token_head) {
    EXPECT_EQ(0, std::memcmp(in.k_scales.data(), want.k_scales.data(), 4 * in.k_scales.size())) << "k_scales";
    EXPECT_EQ(0, std::memcmp(in.v_scales.data(), want.v_scales.data(), 4 * in.v_scales.size())) << "v_scales";
  }
}

struct Flavor {
  DType dtype;
  ScaleMode scales;
};
constexpr Flavor kFlavors[] = {{DType::bf16, ScaleMode::none},
                               {DType::fp16, ScaleMode::none},
                               {DType::fp8_e4m3, ScaleMode::per_tensor},
                               {DType::fp8_e4m3, ScaleMode::per_token_head},
                               {DType::fp8_e5m2, ScaleMode::per_tensor},
                               {DType::fp8_e5m2, ScaleMode::per_token_head},
                               {DType::nvfp4, ScaleMode::per_tensor}};

TEST(PreAttention, MatchesFloat64NormRopeThenInsertForEveryCache) {
  std::uint64_t seed = 11;
  int n = 0;
  const DType tables[] = {DType::f32, DType::bf16, DType::fp16};
  const int64_t token_counts[] = {1, 37, 129};
  for (const Flavor& f : kFlavors) {
    for (Layout layout : {Layout::hnd, Layout::nhd, Layout::split}) {
      if (f.dtype == DType::nvfp4 && layout != Layout::hnd) continue;
      for (DType src : {DType::bf16, DType::fp16}) {
        Case c;
        c.src = src;
        c.kv = f.dtype;
        c.scales = f.scales;
        c.layout = layout;
        c.page_pad = n % 2 ? (f.dtype == DType::nvfp4 ? 4096 : 1000) : 0;
        c.index = n % 3 == 1 ? DType::bf16 : (n % 3 == 2 ? DType::nvfp4 : DType::fp8_e4m3);
        c.q = n % 3 == 0 ? DType::fp8_e4m3 : (n % 3 == 1 ? src : DType::bf16);
        c.iq = c.index == DType::fp8_e4m3 && n % 2 ? DType::fp8_e4m3 : (n % 4 == 0 ? DType::fp16 : src);
        c.weight = tables[n % 3];
        c.table = tables[(n / 3) % 3];
        static constexpr int kHeads[][3] = {{16, 1, 1}, {4, 2, 2}, {3, 1, 2}, {8, 3, 3}};
        c.nq = kHeads[n % 4][0];
        c.nkv = kHeads[n % 4][1];
        c.niq = kHeads[n % 4][2];
        c.tokens = token_counts[n % 3];
        c.row_pad = n % 5 == 2 ? 24 : 0;
        c.own_index_slots = n % 2 == 0;
        c.seed = seed++;
        run_case(c);
        ++n;
      }
    }
  }
}

TEST(PreAttention, M3ShapesAndManyTokens) {
  Case c;
  c.nq = 64;
  c.nkv = 4;
  c.niq = 4;
  c.tokens = 300;
  c.kv = DType::fp8_e4m3;
  c.scales = ScaleMode::per_token_head;
  c.q = DType::fp8_e4m3;
  c.seed = 901;
  run_case(c);
  c.nq = 16;
  c.nkv = 1;
  c.niq = 1;
  c.kv = DType::nvfp4;
  c.scales = ScaleMode::per_tensor;
  c.q = DType::bf16;
  c.tokens = 513;
  c.seed = 902;
  run_case(c);
}

// One head by hand: weight 0, a position whose rotation is the identity (row
// 0: cos 1, sin 0): y = x / rms(x); a zero head stays zero.
TEST(PreAttention, OneHeadByHand) {
  float x[D], w[D] = {}, cs[msa::kRopeDims] = {}, out[D];
  for (int d = 0; d < D; ++d) x[d] = d % 2 ? 2.0f : -2.0f;  // rms 2
  for (int j = 0; j < 32; ++j) cs[j] = 1.0f;
  msa::pre::norm_rope_head(x, w, cs, 0.0f, out);
  for (int d = 0; d < D; ++d) EXPECT_EQ(out[d], d % 2 ? 1.0f : -1.0f) << d;
  // A quarter turn: (a, b) -> (-b, a) on the first 32 pairs.
  for (int j = 0; j < 32; ++j) {
    cs[j] = 0.0f;
    cs[32 + j] = 1.0f;
  }
  for (int d = 0; d < D; ++d) x[d] = float(d + 1);
  float plain[D];
  float identity[msa::kRopeDims] = {};
  for (int j = 0; j < 32; ++j) identity[j] = 1.0f;
  msa::pre::norm_rope_head(x, w, identity, 1e-6f, plain);
  msa::pre::norm_rope_head(x, w, cs, 1e-6f, out);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[j], -plain[j + 32]) << j;
    EXPECT_EQ(out[j + 32], plain[j]) << j;
  }
  for (int d = 64; d < D; ++d) EXPECT_EQ(out[d], plain[d]) << d;
  std::fill(x, x + D, 0.0f);
  msa::pre::norm_rope_head(x, w, cs, 1e-6f, out);
  for (int d = 0; d < D; ++d) EXPECT_EQ(out[d], 0.0f) << d;
}

TEST(PreAttention, RopeTableIsNeoxWithTheta) {
  std::vector<float> t(std::size_t(3 * msa::kRopeDims));
  msa::make_rope_table(msa::kM3RopeTheta, 3, t.data());
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(t[std::size_t(j)], 1.0f);
    EXPECT_EQ(t[std::size_t(32 + j)], 0.0f);
    const double f = std::pow(5.0e6, -j / 32.0);
    EXPECT_EQ(t[std::size_t(2 * 64 + j)], float(std::cos(2.0 * f))) << j;
    EXPECT_EQ(t[std::size_t(2 * 64 + 32 + j)], float(std::sin(2.0 * f))) << j;
  }
  expect_error([] { msa::make_rope_table(0.5, 4, nullptr); }, {"theta", "0.5"});
}

// Unchecked calls: a position outside the table skips its token whole (no q
// row, no cache write), a slot beyond a cache skips that store.
TEST(PreAttention, UncheckedBadPositionsAndSlotsAreSkipped) {
  Case c;
  c.tokens = 9;
  c.seed = 77;
  Inputs in = make_pre_attention_inputs(c);
  for (std::size_t i = 0; i < in.slots.size(); ++i) in.slots[i] = int64_t(3 * i);  // every token inserted ...
  in.positions[4] = in.max_position;  // ... but token 4's position is bad
  in.slots[6] = in.pages * msa::kBlockSize;    // and token 6's slot is beyond the cache
  in.index_slots[6] = -1;
  in.index_slots[7] = in.index_pages * msa::kBlockSize + 3;
  Inputs good = in;
  good.positions[4] = 0;
  good.slots[4] = good.slots[6] = -1;
  good.index_slots[4] = good.index_slots[7] = -1;
  msa::cpu::Options unchecked;
  unchecked.check = false;
  msa::cpu::pre_attention(in.view(in.cache.data(), nullptr, nullptr), in.index_view(in.index_cache.data()),
                          in.args(), unchecked);
  msa::cpu::pre_attention(good.view(good.cache.data(), nullptr, nullptr),
                          good.index_view(good.index_cache.data()), good.args());
  // Token 4's q row stays poisoned in `in`; `good` wrote it (position 0).
  const std::size_t row = std::size_t(c.nq * D * 2);
  for (std::size_t b = 4 * row; b < 5 * row; ++b) ASSERT_EQ(in.q[b], kPoison) << b;
  std::copy(in.q.begin() + 4 * row, in.q.begin() + 5 * row, good.q.begin() + 4 * row);
  std::copy(in.iq.begin() + 4 * D * 2, in.iq.begin() + 5 * D * 2, good.iq.begin() + 4 * D * 2);
  EXPECT_EQ(first_difference(in.q, good.q), "");
  EXPECT_EQ(first_difference(in.iq, good.iq), "");
  EXPECT_EQ(first_difference(in.cache, good.cache), "");
  EXPECT_EQ(first_difference(in.index_cache, good.index_cache), "");
}

TEST(PreAttention, ZeroTokensAndAllSkippedTouchNothing) {
  Case c;
  c.tokens = 5;
  Inputs in = make_pre_attention_inputs(c);
  const Inputs before = in;
  msa::PreAttentionArgs a = in.args();
  a.num_tokens = 0;
  msa::cpu::pre_attention(in.view(in.cache.data(), nullptr, nullptr), in.index_view(in.index_cache.data()), a);
  EXPECT_TRUE(in.q == before.q && in.cache == before.cache && in.index_cache == before.index_cache);
  for (auto& s : in.slots) s = -1;
  for (auto& s : in.index_slots) s = -7;
  msa::cpu::pre_attention(in.view(in.cache.data(), nullptr, nullptr), in.index_view(in.index_cache.data()),
                          in.args());
  EXPECT_TRUE(in.cache == before.cache && in.index_cache == before.index_cache);
  EXPECT_FALSE(in.q == before.q);  // q and index q are written for every token
}

TEST(PreAttention, BadInputNamesArgumentIndexAndValue) {
  Case c;
  c.tokens = 6;
  c.kv = DType::fp8_e4m3;
  c.scales = ScaleMode::per_tensor;
  Inputs in = make_pre_attention_inputs(c);
  const Inputs before = in;
  const msa::KVCacheView cache = in.view(in.cache.data(), nullptr, nullptr);
  const msa::IndexCacheView index = in.index_view(in.index_cache.data());
  auto call = [&](auto edit) {
    return [&, edit] {
      msa::PreAttentionArgs a = in.args();
      msa::KVCacheView kc = cache;
      msa::IndexCacheView ic = index;
      edit(a, kc, ic);
      msa::cpu::pre_attention(kc, ic, a);
    };
  };
  using A = msa::PreAttentionArgs;
  using K = msa::KVCacheView;
  using I = msa::IndexCacheView;
  expect_error(call([](A& a, K&, I&) { a.positions = nullptr; }), {"positions", "null"});
  expect_error(call([&](A& a, K&, I&) {
                 static std::vector<int64_t> p;
                 p = in.positions;
                 p[3] = in.max_position + 2;
                 a.positions = p.data();
               }),
               {"positions[3]", std::to_string(in.max_position + 2), "max_position"});
  expect_error(call([&](A& a, K&, I&) {
                 static std::vector<int64_t> p;
                 p = in.positions;
                 p[2] = -1;
                 a.positions = p.data();
               }),
               {"positions[2]", "-1"});
  expect_error(call([&](A& a, K&, I&) {
                 static std::vector<int64_t> s;
                 s = in.slots;
                 s[4] = in.pages * 128 + 1;
                 a.slots = s.data();
               }),
               {"slots[4]", std::to_string(in.pages * 128 + 1)});
  expect_error(call([&](A& a, K&, I&) {
                 static std::vector<int64_t> s;
                 s = in.index_slots;
                 s[5] = in.index_pages * 128;
                 a.index_slots = s.data();
               }),
               {"index_slots[5]", std::to_string(in.index_pages * 128)});
  expect_error(call([&](A& a, K&, I& i) {
                 static std::vector<int64_t> s;
                 s.assign(std::size_t(in.c.tokens), -1);
                 s[1] = in.pages * 128 - 1;  // fits the main cache, not a 1-page index cache
                 a.slots = s.data();
                 a.index_slots = nullptr;
                 i.num_pages = 1;
               }),
               {"slots[1]", "index cache", "index_slots is null"});
  expect_error(call([](A& a, K&, I&) { a.qkv_dtype = DType::f32; }), {"qkv_dtype", "f32"});
  expect_error(call([](A& a, K&, I&) { a.num_kv_heads = 2; }), {"num_kv_heads = 2", "cache.num_kv_heads = 1"});
  expect_error(call([](A& a, K&, I&) { a.num_q_heads = 0; }), {"num_q_heads", "0"});
  expect_error(call([](A& a, K&, I&) { a.num_index_heads = -1; }), {"num_index_heads", "-1"});
  expect_error(call([](A& a, K&, I&) { a.qkv_row_stride = 100; }), {"qkv_row_stride = 100", "2560"});
  expect_error(call([](A& a, K&, I&) { a.weight_dtype = DType::fp8_e4m3; }), {"weight_dtype", "fp8_e4m3"});
  expect_error(call([](A& a, K&, I&) { a.cos_sin_dtype = DType::i32; }), {"cos_sin_dtype", "i32"});
  expect_error(call([](A& a, K&, I&) { a.eps = -1.0f; }), {"eps", "-1"});
  expect_error(call([](A& a, K&, I&) {
                 a.q_dtype = DType::fp8_e4m3;
                 a.q_scale = 0.0f;
               }),
               {"q_scale", "0"});
  expect_error(call([](A& a, K&, I&) { a.q_dtype = DType::fp8_e5m2; }), {"q_dtype", "fp8_e5m2"});
  expect_error(call([](A& a, K&, I& i) {
                 a.index_q_dtype = DType::fp8_e4m3;
                 i.dtype = DType::bf16;
               }),
               {"index_q_dtype = fp8_e4m3", "index_cache.dtype = bf16"});
  expect_error(call([](A& a, K&, I&) { a.max_position = 0; }), {"max_position"});
  expect_error(call([](A& a, K&, I&) { a.k_weight = nullptr; }), {"k_weight", "null"});
  expect_error(call([](A& a, K&, I&) { a.index_q = nullptr; }), {"index_q", "null"});
  expect_error(call([](A& a, K&, I&) { a.cos_sin = nullptr; }), {"cos_sin", "null"});
  expect_error(call([](A&, K& k, I&) { k.k_scale = -1.0f; }), {"cache.k_scale", "-1"});
  expect_error(call([](A&, K&, I& i) { i.dtype = DType::fp16; }), {"index_cache.dtype", "fp16"});
  // A failed call leaves everything untouched.
  EXPECT_TRUE(in.q == before.q && in.cache == before.cache && in.index_cache == before.index_cache);
}

// The kernel's (token, head) split: exact for every divisor it may meet and
// dividends up to 2^31 - 1.
TEST(PreAttention, FastDivideIsExact) {
  std::mt19937_64 rng(5);
  std::vector<std::uint32_t> divisors;
  for (std::uint32_t d = 1; d <= 600; ++d) divisors.push_back(d);
  for (std::uint32_t d : {1023u, 1024u, 1025u, 65535u, 65536u, 65537u, 1000003u, 0x7FFFFFFFu}) divisors.push_back(d);
  for (std::uint32_t d : divisors) {
    const msa::cuda::FastDivisor f(d);
    std::vector<std::uint32_t> ns = {0u, 1u, d - 1, d, d + 1, 0x7FFFFFFFu, 0x7FFFFFFFu - d};
    for (std::uint32_t k = 1; k < 64; ++k) ns.push_back(k * d - 1), ns.push_back(k * d);
    for (int k = 0; k < 200; ++k) ns.push_back(std::uint32_t(rng() >> 33));
    for (std::uint32_t n : ns) {
      if (n > 0x7FFFFFFFu) continue;
      ASSERT_EQ(f.divide(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
