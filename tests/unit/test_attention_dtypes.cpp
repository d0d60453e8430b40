// Every KV dtype and layout: the engine against the float64 oracle on the
// dequantized cache (read by the cache reader), layouts bit-identical to each
// other, the fp8 query against its dequantized value, and caches written by
// cpu::insert_kv.
#include <cstring>

#include "test_attention_common.hpp"

namespace attn_test {
namespace {

std::vector<CacheSpec> all_kv_dtypes() {
  std::vector<CacheSpec> specs;
  for (DType dt : {DType::bf16, DType::fp16}) specs.push_back({dt, Layout::hnd, ScaleMode::none, 2, 0});
  for (DType dt : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    specs.push_back({dt, Layout::hnd, ScaleMode::per_tensor, 2, 0});
    specs.push_back({dt, Layout::nhd, ScaleMode::per_token_head, 2, 0});
  }
  specs.push_back({DType::nvfp4, Layout::hnd, ScaleMode::per_tensor, 2, 0});
  return specs;
}

// A decode, two verify-free prefills (one chunked), random selections.
ProblemSpec mixed_spec(const CacheSpec& cache) {
  ProblemSpec ps;
  ps.requests = {{1, 1700}, {1, 130}, {150, 1400}, {37, 37}};
  ps.num_decodes = 2;
  ps.cache = cache;
  ps.num_q_heads = 8;
  ps.topk = 16;
  return ps;
}

TEST(AttentionDtypes, EveryKvDtypeMatchesOracle) {
  unsigned seed = 2000;
  for (const CacheSpec& cs : all_kv_dtypes()) {
    ++seed;
    SCOPED_TRACE(describe(cs) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Problem pb = make_problem(mixed_spec(cs), rng);
    const Result res = run(pb);
    expect_matches_reference(pb, res);
  }
}

// The same logical content in every physical order gives bit-identical results.
TEST(AttentionDtypes, LayoutsAreBitIdentical) {
  const unsigned seed = 2100;
  for (const CacheSpec& base : all_kv_dtypes()) {
    std::vector<CacheSpec> variants;
    if (base.dtype == DType::nvfp4) {
      variants = {base, base};
      variants[1].extra_page_stride = 4096 + 72;
    } else {
      for (Layout l : {Layout::hnd, Layout::nhd, Layout::split}) {
        for (std::int64_t extra : {0, 3 * 128 * 256 + 64}) {
          CacheSpec v = base;
          v.layout = l;
          v.extra_page_stride = extra;
          variants.push_back(v);
        }
      }
    }
    std::mt19937 rng0(seed);
    ProblemSpec ps = mixed_spec(variants[0]);
    Problem first = make_problem(ps, rng0);
    const Result want = run(first);
    for (const CacheSpec& v : variants) {
      SCOPED_TRACE(describe(v) + " seed " + std::to_string(seed));
      std::mt19937 rng(seed);
      ps.cache = v;
      Problem pb = make_problem(ps, rng);
      const Result got = run(pb);
      EXPECT_EQ(0, std::memcmp(got.out.data(), want.out.data(), want.out.size() * 2));
      EXPECT_EQ(0, std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * 4));
    }
  }
}

// An fp8 query with a power-of-two scale dequantizes exactly into bf16: the
// result must be bit-identical to feeding that bf16 query. Other scales go
// against the oracle, for both output dtypes.
TEST(AttentionDtypes, Fp8QueryEqualsDequantizedQuery) {
  const unsigned seed = 2200;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ProblemSpec ps = mixed_spec({DType::bf16, Layout::hnd, ScaleMode::none, 2, 0});
  ps.q_dtype = DType::fp8_e4m3;
  ps.q_scale = 0.125f;
  Problem pb = make_problem(ps, rng);
  const Result fp8 = run(pb);
  expect_matches_reference(pb, fp8);

  Problem deq = pb;
  deq.cache.view = pb.cache.view;  // the copy's view still points at pb's bytes: fine, same content
  deq.q_dtype = DType::bf16;
  deq.q.resize(pb.q.size() * 2);
  for (std::size_t i = 0; i < pb.q.size(); ++i) {
    const float x = msa::num::e4m3_to_float(pb.q[i]) * pb.q_scale;
    const std::uint16_t b = msa::num::float_to_bf16(x);
    ASSERT_EQ(msa::num::bf16_to_float(b), x) << "element " << i;
    std::memcpy(deq.q.data() + 2 * i, &b, 2);
  }
  const Result bf16 = run(deq);
  EXPECT_EQ(0, std::memcmp(fp8.out.data(), bf16.out.data(), fp8.out.size() * 2));
  EXPECT_EQ(0, std::memcmp(fp8.lse.data(), bf16.lse.data(), fp8.lse.size() * 4));

  for (DType out : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(std::string("out ") + msa::dtype_name(out));
    std::mt19937 rng2(seed + 1);
    ps.q_scale = 0.0371f;
    ps.out_dtype = out;
    ps.cache = {DType::fp8_e4m3, Layout::hnd, ScaleMode::per_tensor, 2, 0};
    Problem p2 = make_problem(ps, rng2);
    expect_matches_reference(p2, run(p2));
  }
}

// Caches written by the engine's own insert (engineer A's cpu::insert_kv).
TEST(AttentionDtypes, CachesWrittenByInsertKv) {
  unsigned seed = 2300;
  for (const CacheSpec& cs : all_kv_dtypes()) {
    ++seed;
    SCOPED_TRACE(describe(cs) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    ProblemSpec ps = mixed_spec(cs);
    Problem pb = make_problem(ps, rng);
    // Overwrite every token through insert_kv from fresh bf16 inputs.
    const int H = cs.num_kv_heads;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (std::size_t r = 0; r < ps.requests.size(); ++r) {
      const int n = ps.requests[r].seq_len;
      std::vector<std::uint16_t> k(std::size_t(n) * H * D), v(k.size());
      for (auto& x : k) x = msa::num::float_to_bf16(nd(rng));
      for (auto& x : v) x = msa::num::float_to_bf16(nd(rng));
      std::vector<std::int64_t> slots(n);
      for (int j = 0; j < n; ++j) slots[j] = std::int64_t(pb.cache.table[r * pb.cache.max_blocks + j / N]) * N + j % N;
      msa::InsertKVArgs ia;
      ia.k = k.data();
      ia.v = v.data();
      ia.src_dtype = DType::bf16;
      ia.slots = slots.data();
      ia.num_tokens = n;
      try {
        msa::cpu::insert_kv(pb.cache.view, ia);
      } catch (const msa::Error& e) {
        if (std::string(e.what()).find("not implemented") != std::string::npos) GTEST_SKIP() << e.what();
        throw;
      }
    }
    expect_matches_reference(pb, run(pb));
  }
}

}  // namespace
}  // namespace attn_test
