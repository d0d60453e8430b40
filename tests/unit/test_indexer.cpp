// The CPU indexer (contract 5) against a brute-force reference written here:
// block scores in double (accuracy) and as the documented fp32 FMA chain
// (bit-identity), and a selection by plain sorting. The index cache is written
// directly through IndexCacheView::offset; the step is built by hand.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "cpu/indexer_dots.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace {

using namespace msa;
using msa::test::expect_error;
constexpr int B = kBlockSize, D = kHeadDim;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr std::int32_t kPoison = 0x5A5A5A5A;

bool same_score(float a, float b) { return (a != a && b != b) || a == b; }

// ---- the reference ------------------------------------------------------------

// NaN-lowest max over scores, NaN only if all are NaN.
template <typename T>
T ref_max(const std::vector<T>& v) {
  T best = std::numeric_limits<T>::quiet_NaN();
  for (T x : v) {
    if (x != x) continue;
    if (best != best || x > best) best = x;
  }
  return best;
}

// Selection by sorting: forced blocks, then the others by (not NaN, score
// descending, id ascending) until min(topk, last + 1) are taken; ascending ids.
std::vector<std::int32_t> ref_select(const float* s, int last, int topk, int init, int local) {
  std::vector<std::int32_t> out(topk, -1);
  if (last < 0) return out;
  const int n = last + 1, valid = std::min(topk, n);
  std::vector<std::int32_t> chosen, others;
  for (int b = 0; b < n; ++b) (b < init || b > last - local ? chosen : others).push_back(b);
  std::stable_sort(others.begin(), others.end(), [&](int a, int b) {
    const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
    if (na || nb) return !na && nb;
    return s[a] > s[b];
  });
  for (std::size_t i = 0; chosen.size() < std::size_t(valid); ++i) chosen.push_back(others[i]);
  std::sort(chosen.begin(), chosen.end());
  std::copy(chosen.begin(), chosen.end(), out.begin());
  return out;
}

// ---- a hand-built step with its index cache -----------------------------------

struct Spec {
  std::vector<std::int32_t> query_lens, seq_lens;  // per request; seq_len 0 = padding
  std::int32_t num_decodes = 0;                    // leading requests that are decodes
  int heads = 4, topk = 16, init = 0, local = 1;
  DType iq_dtype = DType::bf16, cache_dtype = DType::bf16;
  std::int64_t page_stride_pages = 1;  // > 1: pages interleaved with other layers' pages
  float global_scale = 1.0f / 64.0f;   // nvfp4 cache only
};

// One nvfp4 index row (contract 4.2): 64 data bytes, element 2i in the low
// nibble of byte i, then the e4m3 scale of elements 16g .. 16g + 15 at byte 64 + g.
constexpr int kRowBytes = 72, kPageBytes = B * kRowBytes;

// Element d of an nvfp4 row as the CPU engine decodes it: e2m1 * scale * global
// in fp32, left to right.
float nvfp4_element(const std::uint8_t* row, int d, float global) {
  const std::uint8_t code = std::uint8_t(d % 2 ? row[d / 2] >> 4 : row[d / 2] & 0xF);
  return num::e2m1_to_float(code) * num::e4m3_to_float(row[64 + d / 16]) * global;
}

struct Case {
  Spec spec;
  std::vector<std::int32_t> query_start, seq_lens, token_request, table;
  std::vector<std::uint8_t> iq;      // [tokens, heads, 128] of iq_dtype
  std::vector<std::uint8_t> bytes;   // index cache storage
  std::vector<float> shadow;         // nvfp4: the unquantized value of every cache element
  StepView step;
  IndexerArgs args;
  std::int32_t max_blocks = 0;

  std::int32_t position(std::int32_t t) const { return step.position(t); }
  std::size_t q_index(std::int32_t t, int h, int d) const { return (std::size_t(t) * spec.heads + h) * D + d; }
  float q(std::int32_t t, int h, int d) const {
    const std::size_t i = q_index(t, h, d);
    if (spec.iq_dtype == DType::fp8_e4m3) return num::e4m3_to_float(iq[i]);
    std::uint16_t v;
    std::memcpy(&v, iq.data() + 2 * i, 2);
    return spec.iq_dtype == DType::bf16 ? num::bf16_to_float(v) : num::fp16_to_float(v);
  }
  std::int64_t at(std::int32_t r, std::int32_t j, int d) const {
    return args.cache.offset(args.block_table.at(r, j / B), j % B, d);
  }
  // nvfp4: byte offset of the row of position j of request r, and the shadow index of element d.
  std::int64_t row_at(std::int32_t r, std::int32_t j) const {
    return std::int64_t(args.block_table.at(r, j / B)) * args.cache.page_stride + (j % B) * kRowBytes;
  }
  std::size_t shadow_at(std::int32_t r, std::int32_t j, int d) const {
    return (std::size_t(args.block_table.at(r, j / B)) * B + std::size_t(j % B)) * D + std::size_t(d);
  }
  float k(std::int32_t r, std::int32_t j, int d) const {
    if (spec.cache_dtype == DType::nvfp4) return nvfp4_element(bytes.data() + row_at(r, j), d, spec.global_scale);
    const std::int64_t o = at(r, j, d);
    if (spec.cache_dtype == DType::bf16) {
      std::uint16_t v;
      std::memcpy(&v, bytes.data() + 2 * o, 2);
      return num::bf16_to_float(v);
    }
    return num::e4m3_to_float(bytes[o]);
  }
  // Sets one element; nvfp4 quantizes the element's 16-value group again.
  void set_k(std::int32_t r, std::int32_t j, int d, float x) {
    if (spec.cache_dtype == DType::nvfp4) {
      shadow[shadow_at(r, j, d)] = x;
      const float* g = &shadow[shadow_at(r, j, d / 16 * 16)];
      std::uint8_t* row = bytes.data() + row_at(r, j);
      float amax = 0.0f;
      for (int e = 0; e < 16; ++e) amax = std::fmax(amax, std::fabs(g[e]));
      const float s = spec.global_scale;
      const std::uint8_t sf = num::nvfp4_group_scale(amax, s);
      row[64 + d / 16] = sf;
      for (int e = 0; e < 16; e += 2)
        row[(d / 16 * 16 + e) / 2] = std::uint8_t(num::nvfp4_encode(g[e], sf, s) | (num::nvfp4_encode(g[e + 1], sf, s) << 4));
      return;
    }
    const std::int64_t o = at(r, j, d);
    if (spec.cache_dtype == DType::bf16) {
      const std::uint16_t v = num::float_to_bf16(x);
      std::memcpy(bytes.data() + 2 * o, &v, 2);
    } else {
      bytes[o] = num::float_to_e4m3(x);
    }
  }
  void set_q(std::int32_t t, int h, int d, float x) {
    const std::size_t i = q_index(t, h, d);
    if (spec.iq_dtype == DType::fp8_e4m3) {
      iq[i] = num::float_to_e4m3(x);
      return;
    }
    const std::uint16_t v = spec.iq_dtype == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
    std::memcpy(iq.data() + 2 * i, &v, 2);
  }
  // Dequantized keys [request][j * 128 + d] and queries, read back from the
  // cache and index_q; refresh() after editing either.
  std::vector<std::vector<float>> kf;
  std::vector<float> qf;
  void refresh() {
    kf.assign(seq_lens.size(), {});
    for (std::size_t r = 0; r < seq_lens.size(); ++r) {
      for (std::int32_t j = 0; j < seq_lens[r]; ++j) {
        for (int d = 0; d < D; ++d) kf[r].push_back(k(std::int32_t(r), j, d));
      }
    }
    qf.resize(std::size_t(step.num_tokens) * spec.heads * D);
    for (std::int32_t t = 0; t < step.num_tokens; ++t) {
      for (int h = 0; h < spec.heads; ++h) {
        for (int d = 0; d < D; ++d) qf[(std::size_t(t) * spec.heads + h) * D + d] = q(t, h, d);
      }
    }
  }
  // Score of block b for (t, h): the documented fp32 FMA chain, or double.
  template <typename T>
  T ref_score(std::int32_t t, int h, std::int32_t b) const {
    const std::int32_t p = position(t), r = token_request[t];
    if (p < 0 || b > p / B) return -std::numeric_limits<T>::infinity();
    const float* qv = &qf[(std::size_t(t) * spec.heads + h) * D];
    std::vector<T> dots;
    for (std::int32_t j = b * B; j <= std::min(p, b * B + B - 1); ++j) {
      const float* kv = &kf[r][std::size_t(j) * D];
      T acc = 0;
      for (int d = 0; d < D; ++d) {
        if constexpr (sizeof(T) == 4) acc = std::fma(qv[d], kv[d], acc);
        else acc += T(qv[d]) * T(kv[d]);
      }
      dots.push_back(acc);
    }
    return ref_max(dots);
  }
};

Case make_case(const Spec& spec, std::uint64_t seed) {
  Case s;
  s.spec = spec;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  const std::int32_t n = std::int32_t(spec.query_lens.size());
  s.query_start.assign(1, 0);
  for (std::int32_t r = 0; r < n; ++r) {
    s.query_start.push_back(s.query_start.back() + spec.query_lens[r]);
    for (std::int32_t i = 0; i < spec.query_lens[r]; ++i) s.token_request.push_back(r);
  }
  s.seq_lens = spec.seq_lens;
  const std::int32_t tokens = s.query_start.back();
  s.step.num_requests = n;
  s.step.num_tokens = tokens;
  s.step.num_decodes = spec.num_decodes;
  s.step.decode_query_len = spec.num_decodes ? spec.query_lens[0] : 0;
  s.step.num_decode_tokens = s.query_start[spec.num_decodes];
  s.step.query_start = s.query_start.data();
  s.step.seq_lens = s.seq_lens.data();
  s.step.token_request = s.token_request.data();

  // Block table over shuffled pages, spare pages and -1 beyond each row's blocks.
  std::int32_t total = 0;
  for (std::int32_t r = 0; r < n; ++r) {
    s.max_blocks = std::max(s.max_blocks, (spec.seq_lens[r] + B - 1) / B);
    total += (spec.seq_lens[r] + B - 1) / B;
  }
  const std::int32_t pages = total + 3, row_stride = s.max_blocks + 2;
  std::vector<std::int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  s.table.assign(std::size_t(std::max(n, 1)) * row_stride, -1);
  for (std::int32_t r = 0, next = 0; r < n; ++r) {
    for (std::int32_t b = 0; b < (spec.seq_lens[r] + B - 1) / B; ++b) s.table[r * row_stride + b] = perm[next++];
  }

  IndexerArgs& a = s.args;
  const bool nvfp4 = spec.cache_dtype == DType::nvfp4;
  a.cache = make_index_cache_view(spec.cache_dtype, nullptr, pages,
                                  spec.page_stride_pages * (nvfp4 ? kPageBytes : B * D),
                                  nvfp4 ? spec.global_scale : 1.0f);
  const std::int64_t units = pages * a.cache.page_stride;  // bytes for nvfp4, elements otherwise
  s.bytes.assign(nvfp4 ? units : units * std::int64_t(dtype_bytes(spec.cache_dtype)), 0);
  if (nvfp4) s.shadow.assign(std::size_t(pages) * B * D, 0.0f);
  a.cache.base = s.bytes.data();
  a.block_table = BlockTable{s.table.data(), n, s.max_blocks + 2, row_stride};
  a.iq_dtype = spec.iq_dtype;
  a.num_kv_heads = spec.heads;
  a.init_blocks = spec.init;
  a.local_blocks = spec.local;
  a.out.topk = spec.topk;

  // Every slot of every used page starts huge (+-400, random sign): keys that
  // leak past p or past seq_len show up in the scores. Then the real keys.
  std::bernoulli_distribution coin;
  for (std::int32_t r = 0; r < n; ++r) {
    const std::int32_t blocks = (spec.seq_lens[r] + B - 1) / B;
    for (std::int32_t j = 0; j < blocks * B; ++j) {
      for (int d = 0; d < D; ++d) s.set_k(r, j, d, j < spec.seq_lens[r] ? normal(rng) : (coin(rng) ? 400.f : -400.f));
    }
  }
  s.iq.resize(std::size_t(tokens) * spec.heads * D * (spec.iq_dtype == DType::fp8_e4m3 ? 1 : 2));
  a.index_q = s.iq.data();
  for (std::int32_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < spec.heads; ++h) {
      for (int d = 0; d < D; ++d) s.set_q(t, h, d, normal(rng));
    }
  }
  return s;
}

// Runs block_scores and index on `s` and holds them to the reference.
void check_against_reference(Case& s, int threads) {
  const int H = s.spec.heads, K = s.spec.topk;
  const std::int32_t T = s.step.num_tokens, cols = s.max_blocks + 3;
  cpu::Options opt;
  opt.num_threads = threads;
  s.refresh();

  std::vector<float> scores(std::size_t(T) * H * cols, std::numeric_limits<float>::quiet_NaN());
  cpu::block_scores(s.step, s.args, scores.data(), cols, opt);
  for (std::int32_t t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      for (std::int32_t b = 0; b < cols; ++b) {
        const float got = scores[(std::size_t(t) * H + h) * cols + b];
        const float want = s.ref_score<float>(t, h, b);
        ASSERT_TRUE(same_score(got, want)) << "t=" << t << " h=" << h << " b=" << b << " p="
                                           << s.position(t) << " got " << got << " want " << want;
        const double exact = s.ref_score<double>(t, h, b);
        if (std::isfinite(exact)) {
          ASSERT_NEAR(got, exact, 1e-4 * (1.0 + std::fabs(exact)));
        }
      }
    }
  }

  // Token-major output and a [kv_head, token, topk + 3] view, both poisoned.
  std::vector<std::int32_t> tm(std::size_t(T) * H * K, kPoison), hm(std::size_t(H) * T * (K + 3), kPoison);
  s.args.out = TopkView::token_major(tm.data(), H, K);
  cpu::index(s.step, s.args, opt);
  s.args.out = TopkView{hm.data(), K, K + 3, std::int64_t(T) * (K + 3)};
  cpu::index(s.step, s.args, opt);
  for (std::int32_t t = 0; t < T; ++t) {
    const std::int32_t p = s.position(t);
    for (int h = 0; h < H; ++h) {
      SCOPED_TRACE("t=" + std::to_string(t) + " h=" + std::to_string(h) + " p=" + std::to_string(p));
      const auto want = ref_select(&scores[(std::size_t(t) * H + h) * cols], p < 0 ? -1 : p / B, K,
                                   s.spec.init, s.spec.local);
      const std::int32_t* a = &tm[(std::size_t(t) * H + h) * K];
      const std::int32_t* b = &hm[(std::size_t(h) * T + t) * (K + 3)];
      ASSERT_EQ(std::vector<std::int32_t>(a, a + K), want);
      ASSERT_EQ(std::vector<std::int32_t>(b, b + K), want);
      for (int k = K; k < K + 3; ++k) ASSERT_EQ(b[k], kPoison) << "wrote past topk";
    }
  }
}

// ---- selection alone -----------------------------------------------------------

TEST(IndexerSelect, MatchesReferenceOnRandomRows) {
  const std::uint64_t seed = 20240611;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const float specials[] = {NAN, -kInf, kInf, 0.0f, -0.0f, 1.0f, -1.0f, 0.5f};
  for (int iter = 0; iter < 3000; ++iter) {
    const int last = std::uniform_int_distribution<int>(-1, iter % 10 == 0 ? 1200 : 90)(rng);
    const int topk = iter % 7 == 0 ? 64 : (iter % 5 == 0 ? 1 : std::uniform_int_distribution<int>(1, 64)(rng));
    const int init = std::uniform_int_distribution<int>(0, std::min(topk, 3))(rng);
    const int local = std::uniform_int_distribution<int>(0, std::min(topk - init, 3))(rng);
    const int mode = iter % 3;  // 0 continuous, 1 few distinct values (ties), 2 specials
    std::vector<float> s(std::max(last + 1, 1));
    for (float& x : s) {
      if (mode == 0) x = std::normal_distribution<float>()(rng);
      else if (mode == 1) x = float(std::uniform_int_distribution<int>(0, 3)(rng));
      else x = specials[std::uniform_int_distribution<int>(0, 7)(rng)];
    }
    std::vector<std::int32_t> out(topk + 1, kPoison);
    cpu::select_row(s.data(), last, topk, init, local, out.data());
    SCOPED_TRACE("iter " + std::to_string(iter) + " last " + std::to_string(last) + " topk " +
                 std::to_string(topk) + " init " + std::to_string(init) + " local " + std::to_string(local));
    ASSERT_EQ(std::vector<std::int32_t>(out.begin(), out.begin() + topk),
              ref_select(s.data(), last, topk, init, local));
    ASSERT_EQ(out[topk], kPoison);
  }
}

TEST(IndexerSelect, ExplicitRows) {
  std::int32_t out[4];
  const float ties[6] = {1, 2, 2, 2, 0, 1};
  cpu::select_row(ties, 5, 3, 0, 1, out);  // forced 5, then 1 and 2 (ties to the lower id)
  EXPECT_EQ(std::vector<std::int32_t>(out, out + 3), (std::vector<std::int32_t>{1, 2, 5}));
  const float nans[5] = {NAN, NAN, NAN, -kInf, 7};
  cpu::select_row(nans, 4, 4, 0, 1, out);  // -inf beats NaN; NaN ties to lower ids
  EXPECT_EQ(std::vector<std::int32_t>(out, out + 4), (std::vector<std::int32_t>{0, 1, 3, 4}));
  cpu::select_row(nans, 1, 4, 0, 1, out);  // fewer eligible than topk
  EXPECT_EQ(std::vector<std::int32_t>(out, out + 4), (std::vector<std::int32_t>{0, 1, -1, -1}));
  cpu::select_row(nans, -1, 4, 0, 1, out);  // padding row
  EXPECT_EQ(std::vector<std::int32_t>(out, out + 4), (std::vector<std::int32_t>{-1, -1, -1, -1}));
  const float low_init[5] = {-5, 3, 9, 1, 0};
  cpu::select_row(low_init, 4, 2, 1, 0, out);  // init forces 0, best other is 2, no local
  EXPECT_EQ(std::vector<std::int32_t>(out, out + 2), (std::vector<std::int32_t>{0, 2}));
  EXPECT_THROW(cpu::select_row(low_init, 4, 0, 0, 0, out), Error);
  EXPECT_THROW(cpu::select_row(low_init, 4, 65, 0, 0, out), Error);
  EXPECT_THROW(cpu::select_row(low_init, 4, 2, 2, 1, out), Error);
  EXPECT_THROW(cpu::select_row(low_init, 4, 2, -1, 1, out), Error);
}

// ---- the block kernels -----------------------------------------------------------

TEST(IndexerKernels, EveryIsaMatchesTheFmaChain) {
  const std::uint64_t seed = 77;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  cpu::indexer::KeyBlock keys;
  for (float& x : keys.v) x = normal(rng);
  keys.v[5 * B + 17] = NAN;    // key 17 gives NaN dots
  keys.v[9 * B + 100] = kInf;  // key 100: +-inf dots
  const int rows = 31;         // every tile remainder
  std::vector<float> q(rows * D);
  for (float& x : q) x = normal(rng);
  for (int d = 0; d < D; ++d) q[3 * D + d] = NAN;  // row 3: all NaN
  std::vector<std::int32_t> visible(rows);
  for (int r = 0; r < rows; ++r) visible[r] = r < 4 ? std::array<int, 4>{0, 1, 18, 128}[r] : int(rng() % 129);
  for (auto isa : {cpu::indexer::Isa::generic, cpu::indexer::Isa::avx2, cpu::indexer::Isa::avx512}) {
    if (!cpu::indexer::isa_supported(isa)) continue;
    SCOPED_TRACE(cpu::indexer::isa_name(isa));
    const auto kernel = cpu::indexer::max_dots_kernel(isa);
    for (bool masked : {false, true}) {
      std::vector<float> out(rows * 2, -123.f);
      kernel(q.data(), rows, keys, masked ? visible.data() : nullptr, out.data(), 2);
      for (int r = 0; r < rows; ++r) {
        std::vector<float> dots;
        for (int j = 0; j < (masked ? visible[r] : B); ++j) {
          float acc = 0;
          for (int d = 0; d < D; ++d) acc = std::fma(q[r * D + d], keys.v[d * B + j], acc);
          dots.push_back(acc);
        }
        ASSERT_TRUE(same_score(out[2 * r], ref_max(dots))) << "row " << r << " masked " << masked;
        ASSERT_EQ(out[2 * r + 1], -123.f);
      }
    }
  }
}

TEST(IndexerKernels, LoadKeyBlockDecodesAndTransposes) {
  std::mt19937_64 rng(5);
  for (DType dt : {DType::bf16, DType::fp8_e4m3}) {
    IndexCacheView c;
    c.dtype = dt;
    c.num_pages = 3;
    c.page_stride = 3 * B * D;  // interleaved layers
    std::vector<std::uint8_t> bytes(c.num_pages * c.page_stride * dtype_bytes(dt));
    for (auto& x : bytes) x = std::uint8_t(rng());
    c.base = bytes.data();
    cpu::indexer::KeyBlock kb;
    cpu::indexer::load_key_block(c, 2, kb);
    for (int j = 0; j < B; ++j) {
      for (int d = 0; d < D; ++d) {
        const std::int64_t o = c.offset(2, j, d);
        std::uint16_t h = 0;
        if (dt == DType::bf16) std::memcpy(&h, bytes.data() + 2 * o, 2);  // fp8: one byte per element
        const float want = dt == DType::bf16 ? num::bf16_to_float(h) : num::e4m3_to_float(bytes[o]);
        ASSERT_EQ(num::float_bits(kb.v[d * B + j]), num::float_bits(want)) << dtype_name(dt) << " j=" << j;
      }
    }
  }
}

TEST(IndexerKernels, LoadKeyBlockDecodesNvfp4Rows) {
  std::mt19937_64 rng(6);
  for (float global : {1.0f / 64.0f, 0.0173f}) {
    // Three pages 2.5 pages apart (interleaved layers, odd byte stride).
    const IndexCacheView c = make_index_cache_view(DType::nvfp4, nullptr, 3, 5 * kPageBytes / 2 + 3, global);
    std::vector<std::uint8_t> bytes(std::size_t(c.num_pages * c.page_stride));
    for (auto& x : bytes) x = std::uint8_t(rng());
    IndexCacheView view = c;
    view.base = bytes.data();
    cpu::indexer::KeyBlock kb;
    cpu::indexer::load_key_block(view, 2, kb);
    int nans = 0;
    for (int j = 0; j < B; ++j) {
      const std::uint8_t* row = bytes.data() + 2 * c.page_stride + j * kRowBytes;
      for (int d = 0; d < D; ++d) {
        const float got = kb.v[d * B + j];
        const float want = nvfp4_element(row, d, global);
        ASSERT_TRUE(same_score(got, want)) << "j=" << j << " d=" << d << " got " << got << " want " << want;
        nans += std::isnan(got);
        // The fp32 value is the real dequantized value rounded once.
        const std::uint8_t code = std::uint8_t(d % 2 ? row[d / 2] >> 4 : row[d / 2] & 0xF);
        const double exact = double(num::e2m1_to_float(code)) * num::e4m3_to_float(row[64 + d / 16]) * double(global);
        if (!std::isnan(exact)) {
          ASSERT_EQ(got, float(exact)) << "j=" << j << " d=" << d;
        }
      }
    }
    EXPECT_GT(nans, 0) << "random scale bytes include the e4m3 NaN";
  }
}

// ---- whole steps ---------------------------------------------------------------------

TEST(Indexer, MixedDecodeAndPrefillM3Like) {
  Spec spec;  // decodes at 1, 129, 2100; chunked prefill; a one-block prefill; padding
  spec.query_lens = {1, 1, 1, 150, 129, 5};
  spec.seq_lens = {1, 129, 2100, 1500, 129, 0};
  spec.num_decodes = 3;
  const std::uint64_t seed = 1001;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Case s = make_case(spec, seed);
  check_against_reference(s, 2);
}

TEST(Indexer, VerifyRowsFp8CacheFp16QueriesTopk64) {
  Spec spec;  // decode_query_len 2, with a padding decode; each verify row its own limit
  spec.query_lens = {2, 2, 2, 2, 2, 2, 1, 200};
  spec.seq_lens = {2, 128, 129, 0, 257, 9000, 1500, 700};
  spec.num_decodes = 6;
  spec.heads = 3;
  spec.topk = 64;
  spec.init = 2;
  spec.local = 2;
  spec.iq_dtype = DType::fp16;
  spec.cache_dtype = DType::fp8_e4m3;
  spec.page_stride_pages = 2;
  const std::uint64_t seed = 1002;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Case s = make_case(spec, seed);
  check_against_reference(s, 2);
}

TEST(Indexer, TopkOneAndOddShapes) {
  for (int local : {0, 1}) {
    Spec spec;
    spec.query_lens = {127, 129};
    spec.seq_lens = {900, 2049};
    spec.heads = 1;
    spec.topk = 1;
    spec.local = local;
    const std::uint64_t seed = 1003 + local;
    SCOPED_TRACE("seed " + std::to_string(seed));
    Case s = make_case(spec, seed);
    check_against_reference(s, 1);
  }
}

TEST(Indexer, InitBlocksAndThreadCountsAgree) {
  Spec spec;
  spec.query_lens = {3, 3, 40};
  spec.seq_lens = {3, 1000, 1300};
  spec.num_decodes = 2;
  spec.heads = 2;
  spec.topk = 5;
  spec.init = 1;
  spec.local = 0;
  const std::uint64_t seed = 1005;
  SCOPED_TRACE("seed " + std::to_string(seed));
  Case s = make_case(spec, seed);
  check_against_reference(s, 3);
  std::vector<std::int32_t> a(std::size_t(s.step.num_tokens) * 2 * 5), b(a.size());
  for (int threads : {1, 2}) {
    s.args.out = TopkView::token_major(threads == 1 ? a.data() : b.data(), 2, 5);
    cpu::Options opt;
    opt.num_threads = threads;
    opt.check = threads == 1;
    cpu::index(s.step, s.args, opt);
  }
  EXPECT_EQ(a, b);
}

TEST(Indexer, KeysAfterThePositionAreIgnoredEvenIfHuge) {
  Spec spec;  // verify rows at p = 257 and 258 (block 2, offsets 1 and 2)
  spec.query_lens = {2};
  spec.seq_lens = {259};
  spec.num_decodes = 1;
  spec.heads = 1;
  spec.topk = 2;
  Case s = make_case(spec, 1006);
  for (int d = 0; d < D; ++d) {
    s.set_k(0, 258, d, 200.f);
    s.set_q(0, 0, d, 1.f);
    s.set_q(1, 0, d, 1.f);
  }
  std::vector<float> scores(2 * 3);
  cpu::block_scores(s.step, s.args, scores.data(), 3);
  EXPECT_LT(scores[2], 1000.f) << "row p=257 saw the key at 258";
  EXPECT_EQ(scores[5], 200.f * D);
  check_against_reference(s, 2);
}

TEST(Indexer, TiesAndNaNScores) {
  Spec spec;
  spec.query_lens = {1, 1};
  spec.seq_lens = {20 * B + 5, 6 * B};
  spec.num_decodes = 2;
  spec.heads = 2;
  spec.topk = 4;
  Case s = make_case(spec, 1007);
  // Request 0: every key the same vector, so every block scores the same.
  for (std::int32_t j = 0; j < spec.seq_lens[0]; ++j) {
    for (int d = 0; d < D; ++d) s.set_k(0, j, d, 0.25f * float(d % 5) - 0.5f);
  }
  // Request 1, head 1: NaN query, so every score is NaN. Head 0: blocks 0-2
  // hold NaN keys, block 4 is the clear winner.
  for (int d = 0; d < D; ++d) s.set_q(1, 1, d, NAN);
  for (std::int32_t j = 0; j < 3 * B; ++j) s.set_k(1, j, 7, NAN);
  for (int d = 0; d < D; ++d) s.set_q(1, 0, d, 1.f);
  for (int d = 0; d < D; ++d) s.set_k(1, 4 * B + 9, d, 3.f);
  std::vector<std::int32_t> out(2 * 2 * 4, kPoison);
  s.args.out = TopkView::token_major(out.data(), 2, 4);
  cpu::index(s.step, s.args);
  const std::vector<std::int32_t> ties{0, 1, 2, 20}, nan_q{0, 1, 2, 5};
  EXPECT_EQ(std::vector<std::int32_t>(out.begin(), out.begin() + 4), ties);
  EXPECT_EQ(std::vector<std::int32_t>(out.begin() + 4, out.begin() + 8), ties);
  EXPECT_EQ(std::vector<std::int32_t>(out.begin() + 12, out.begin() + 16), nan_q);
  // Head 0 of request 1 has 6 blocks for topk 4: NaN blocks 0-2 lose to 3 and 4.
  EXPECT_EQ(std::vector<std::int32_t>(out.begin() + 8, out.begin() + 12), (std::vector<std::int32_t>{0, 3, 4, 5}))
      << "one NaN block fills the last place, ties to the lowest id";
  check_against_reference(s, 2);
}

// nvfp4 keys: decodes, verify rows, chunked prefill, padding, H = 1, 2, 4,
// interleaved pages and a global scale that is not a power of two.
TEST(Indexer, Nvfp4KeysEveryKindOfRow) {
  const std::uint64_t seed = 1011;
  SCOPED_TRACE("seed " + std::to_string(seed));
  int heads[] = {1, 2, 4};
  for (int i = 0; i < 3; ++i) {
    Spec spec;
    if (i == 1) {  // verify rows (decode_query_len 3) and a prefill after them
      spec.query_lens = {3, 3, 3, 3, 260};
      spec.seq_lens = {3, 130, 0, 2049, 1100};
      spec.num_decodes = 4;
    } else {  // decodes, a fresh prompt, a chunk starting mid-block, a padding prefill
      spec.query_lens = {1, 1, 1, 300, 129, 7};
      spec.seq_lens = {1, 129, 3000, 300, 1000, 0};
      spec.num_decodes = 3;
    }
    spec.heads = heads[i];
    spec.iq_dtype = i == 2 ? DType::fp16 : DType::bf16;
    spec.cache_dtype = DType::nvfp4;
    spec.page_stride_pages = i == 0 ? 1 : 3;
    spec.global_scale = i == 1 ? 0.0173f : 1.0f / 64.0f;
    spec.topk = i == 0 ? 16 : 5;
    spec.init = i == 2 ? 1 : 0;
    SCOPED_TRACE("case " + std::to_string(i));
    Case s = make_case(spec, seed + std::uint64_t(i));
    check_against_reference(s, 2);
  }
}

// fp8 e4m3 queries with an fp8 e4m3 cache: decode, verify, prefill, padding.
TEST(Indexer, Fp8QueriesWithFp8Keys) {
  const std::uint64_t seed = 1012;
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int i = 0; i < 2; ++i) {
    Spec spec;
    spec.query_lens = i ? std::vector<std::int32_t>{2, 2, 2, 90} : std::vector<std::int32_t>{1, 1, 400, 3};
    spec.seq_lens = i ? std::vector<std::int32_t>{2, 0, 2500, 1000} : std::vector<std::int32_t>{1, 1300, 400, 0};
    spec.num_decodes = i ? 3 : 2;
    spec.heads = i ? 4 : 1;
    spec.iq_dtype = DType::fp8_e4m3;
    spec.cache_dtype = DType::fp8_e4m3;
    spec.page_stride_pages = 2;
    SCOPED_TRACE("case " + std::to_string(i));
    Case s = make_case(spec, seed + std::uint64_t(i));
    check_against_reference(s, 2);
  }
}

// An fp8 query scores exactly like a bf16 query holding the same values (every
// e4m3 value is a bf16 value), and cast_index_query_e4m3 is the plain cast.
TEST(Indexer, Fp8QueryScoresLikeItsValuesInBf16) {
  Spec spec;
  spec.query_lens = {1, 1, 50};
  spec.seq_lens = {700, 2000, 600};
  spec.num_decodes = 2;
  spec.heads = 2;
  spec.cache_dtype = DType::fp8_e4m3;
  Case s = make_case(spec, 1013);
  const std::int64_t n = std::int64_t(s.step.num_tokens) * spec.heads * D;
  std::vector<std::uint8_t> q8(std::size_t(n), 0xEE);
  cpu::cast_index_query_e4m3(s.iq.data(), DType::bf16, n, q8.data());
  std::vector<std::uint16_t> q16(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint16_t v;
    std::memcpy(&v, s.iq.data() + 2 * i, 2);
    ASSERT_EQ(q8[std::size_t(i)], num::float_to_e4m3(num::bf16_to_float(v))) << i;
    const float x = num::e4m3_to_float(q8[std::size_t(i)]);
    q16[std::size_t(i)] = num::float_to_bf16(x);
    ASSERT_EQ(num::bf16_to_float(q16[std::size_t(i)]), x) << "e4m3 value not exact in bf16";
  }
  const std::int32_t cols = s.max_blocks;
  std::vector<float> a(std::size_t(n / D) * cols), b(a.size());
  IndexerArgs fp8 = s.args, bf16 = s.args;
  fp8.index_q = q8.data();
  fp8.iq_dtype = DType::fp8_e4m3;
  bf16.index_q = q16.data();
  cpu::block_scores(s.step, fp8, a.data(), cols);
  cpu::block_scores(s.step, bf16, b.data(), cols);
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(same_score(a[i], b[i])) << i;
}

TEST(Indexer, CastIndexQueryE4m3) {
  const float xs[] = {0.0f, -0.0f, 1.0f, -1.0625f, 0.3f, 447.0f, 449.0f, 1e6f, -1e6f, 1e-9f,
                      std::numeric_limits<float>::infinity(), -kInf, NAN};
  for (DType src : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(dtype_name(src));
    std::vector<std::uint16_t> in;
    for (float x : xs) in.push_back(src == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x));
    std::vector<std::uint8_t> out(in.size() + 1, 0xEE);
    cpu::cast_index_query_e4m3(in.data(), src, std::int64_t(in.size()), out.data(), {.num_threads = 2});
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float x = src == DType::bf16 ? num::bf16_to_float(in[i]) : num::fp16_to_float(in[i]);
      EXPECT_EQ(out[i], num::float_to_e4m3(x)) << "x = " << x;
    }
    EXPECT_EQ(out[6] & 0x7F, 0x7E) << "449 saturates to 448";
    EXPECT_EQ(out[7], 0x7E) << "inf or overflow saturates";
    EXPECT_EQ(out[11], 0xFE) << "-inf saturates to -448";
    EXPECT_EQ(out[12] & 0x7F, 0x7F) << "NaN stays NaN";
    EXPECT_EQ(out[in.size()], 0xEE) << "wrote past n";
  }
  std::uint16_t one = 0x3F80;
  std::uint8_t out = 0;
  expect_error([&] { cpu::cast_index_query_e4m3(&one, DType::fp8_e4m3, 1, &out); },
               {"src_dtype = fp8_e4m3", "bf16 or fp16"});
  expect_error([&] { cpu::cast_index_query_e4m3(&one, DType::bf16, -1, &out); }, {"n = -1"});
  expect_error([&] { cpu::cast_index_query_e4m3(nullptr, DType::bf16, 1, &out); }, {"src is null"});
  expect_error([&] { cpu::cast_index_query_e4m3(&one, DType::bf16, 1, nullptr); }, {"dst is null"});
  cpu::cast_index_query_e4m3(nullptr, DType::bf16, 0, nullptr);  // nothing to do
}

// ---- bad input -------------------------------------------------------------------------

TEST(Indexer, BadInputIsReportedByName) {
  Spec spec;
  spec.query_lens = {1, 10};
  spec.seq_lens = {300, 400};
  spec.num_decodes = 1;
  spec.heads = 2;
  Case s = make_case(spec, 1008);
  std::vector<std::int32_t> out(11 * 2 * 16);
  s.args.out = TopkView::token_major(out.data(), 2, 16);
  ASSERT_NO_THROW(check::indexer_shape(s.step, s.args));
  auto bad = [&](const std::function<void(IndexerArgs&)>& edit, const std::vector<std::string>& words) {
    IndexerArgs a = s.args;
    edit(a);
    expect_error([&] { check::indexer_shape(s.step, a); }, words);
    expect_error([&] { cpu::index(s.step, a); }, words);
  };
  bad([](IndexerArgs& a) { a.num_kv_heads = 0; }, {"num_kv_heads = 0"});
  bad([](IndexerArgs& a) { a.iq_dtype = DType::fp8_e4m3; },
      {"iq_dtype = fp8_e4m3 with an index cache of bf16", "fp8_e4m3 with an fp8_e4m3 cache"});
  bad([](IndexerArgs& a) { a.iq_dtype = DType::f32; }, {"iq_dtype = f32", "bf16 or fp16"});
  bad([](IndexerArgs& a) { a.iq_dtype = DType::fp8_e5m2; }, {"iq_dtype = fp8_e5m2"});
  // nvfp4 views: the page stride in bytes, a positive finite global scale, no fp8 query.
  const auto nv = [](IndexerArgs& a, float scale) {
    a.cache = make_index_cache_view(DType::nvfp4, a.cache.base, a.cache.num_pages);
    a.cache.global_scale = scale;
  };
  bad([&](IndexerArgs& a) { nv(a, 0.0f); }, {"global_scale = 0", "finite and positive"});
  bad([&](IndexerArgs& a) { nv(a, INFINITY); }, {"global_scale = inf"});
  bad([&](IndexerArgs& a) { nv(a, 1.0f), a.cache.page_stride = 9000; },
      {"page_stride = 9000", "one page (9216 bytes)"});
  bad([&](IndexerArgs& a) { nv(a, 1.0f), a.iq_dtype = DType::fp8_e4m3; },
      {"iq_dtype = fp8_e4m3 with an index cache of nvfp4"});
  {
    IndexerArgs a = s.args;
    nv(a, 0.5f);
    EXPECT_NO_THROW(check::indexer_shape(s.step, a));
    a = s.args;
    a.cache.dtype = DType::fp8_e4m3;
    a.iq_dtype = DType::fp8_e4m3;
    EXPECT_NO_THROW(check::indexer_shape(s.step, a));
  }
  bad([](IndexerArgs& a) { a.index_q = nullptr; }, {"index_q is null"});
  bad([](IndexerArgs& a) { a.cache.dtype = DType::fp16; }, {"cache.dtype = fp16", "bf16, fp8_e4m3 or nvfp4"});
  bad([](IndexerArgs& a) { a.cache.base = nullptr; }, {"cache.base is null"});
  bad([](IndexerArgs& a) { a.cache.num_pages = -1; }, {"cache.num_pages = -1"});
  bad([](IndexerArgs& a) { a.block_table.data = nullptr; }, {"block_table.data is null"});
  bad([](IndexerArgs& a) { a.block_table.num_rows = 1; }, {"block_table.num_rows = 1", "2 requests"});
  bad([](IndexerArgs& a) { a.block_table.max_blocks = -2; }, {"block_table.max_blocks = -2"});
  bad([](IndexerArgs& a) { a.out.topk = 0; }, {"out.topk = 0"});
  bad([](IndexerArgs& a) { a.out.topk = 65; }, {"out.topk = 65"});
  bad([](IndexerArgs& a) { a.init_blocks = -1; }, {"init_blocks = -1"});
  bad([](IndexerArgs& a) { a.local_blocks = -3; }, {"local_blocks = -3"});
  bad([](IndexerArgs& a) { a.init_blocks = 9, a.local_blocks = 8; }, {"9 + 8", "out.topk = 16"});
  bad([](IndexerArgs& a) { a.out.data = nullptr; }, {"out.data is null"});
  bad([](IndexerArgs& a) { a.out.token_stride = 0; }, {"overlap", "token_stride = 0"});
  bad([](IndexerArgs& a) { a.out.head_stride = 8; }, {"overlap", "head_stride = 8"});
  // Data checks of other owners run too: a page beyond the cache.
  const std::int32_t page = s.table[0];
  s.table[0] = 999;
  expect_error([&] { cpu::index(s.step, s.args); }, {"999"});
  s.table[0] = page;
  // block_scores needs room for every eligible block.
  std::vector<float> scores(11 * 2 * 4);
  expect_error([&] { cpu::block_scores(s.step, s.args, scores.data(), 2); },
               {"max_blocks = 2", "position 299", "3 eligible"});
  expect_error([&] { cpu::block_scores(s.step, s.args, scores.data(), 3); }, {"position 390", "4 eligible"});
}

}  // namespace
