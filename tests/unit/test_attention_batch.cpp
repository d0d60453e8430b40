// Batch shapes of the sparse attention: GQA groups and top-k widths, decode,
// speculative verify and mixed batches, odd context lengths, empty rows, the
// order of the top-k entries, thread counts.
#include <cstring>

#include "test_attention_common.hpp"

namespace attn_test {
namespace {

bool bit_equal(const Result& a, const Result& b) {
  return a.out == b.out && std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0;
}

TEST(AttentionBatch, GqaGroupsAndTopk) {
  unsigned seed = 3000;
  for (int group : {1, 2, 8, 16}) {
    for (int topk : {1, 16, 64}) {
      ++seed;
      SCOPED_TRACE("group " + std::to_string(group) + " topk " + std::to_string(topk) + " seed " +
                   std::to_string(seed));
      std::mt19937 rng(seed);
      ProblemSpec ps;
      ps.requests = {{1, 9000}, {1, 300}, {40, 2200}};
      ps.num_decodes = 2;
      ps.cache.num_kv_heads = group == 16 ? 1 : 2;
      ps.num_q_heads = group * ps.cache.num_kv_heads;
      ps.topk = topk;
      Problem pb = make_problem(ps, rng);
      expect_matches_reference(pb, run(pb));
    }
  }
}

// Speculative verify: decode requests of 2 and 4 query tokens, each row with
// its own top-k and causal limit, followed by prefills.
TEST(AttentionBatch, VerifyRows) {
  unsigned seed = 3100;
  for (int qlen : {2, 4}) {
    ++seed;
    SCOPED_TRACE("decode_query_len " + std::to_string(qlen) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    ProblemSpec ps;
    ps.requests = {{qlen, 1025}, {qlen, qlen}, {qlen, 128 + qlen - 1}, {qlen, 3000}, {5, 260}};
    ps.num_decodes = 4;
    ps.num_q_heads = 4;
    ps.cache.num_kv_heads = 1;
    Problem pb = make_problem(ps, rng);
    expect_matches_reference(pb, run(pb));
  }
}

// Contexts of 1, 127, 129, 2047 and 2049 tokens, as decodes and as the cached
// part of prefills.
TEST(AttentionBatch, OddContextLengths) {
  unsigned seed = 3200;
  for (int ctx : {1, 127, 128, 129, 2047, 2049}) {
    ++seed;
    SCOPED_TRACE("context " + std::to_string(ctx) + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    ProblemSpec ps;
    ps.requests = {{1, ctx + 1}, {1, ctx}, {3, ctx + 3}, {1, ctx + 1}};
    ps.requests.back().query_len = ctx + 1 > 130 ? 130 : ctx + 1;  // a prefill (whole or chunked)
    ps.num_decodes = 2;
    ps.num_q_heads = 2;
    ps.cache.num_kv_heads = 2;
    ps.cache.dtype = DType::fp8_e4m3;
    ps.cache.scale_mode = ScaleMode::per_tensor;
    Problem pb = make_problem(ps, rng);
    expect_matches_reference(pb, run(pb));
  }
}

// Padding requests (seq_len 0) and rows whose top-k lists are all -1 give
// out 0 and lse -inf, never NaN, whatever the output held before.
TEST(AttentionBatch, EmptyRowsAreZeroAndMinusInf) {
  const unsigned seed = 3300;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ProblemSpec ps;
  ps.requests = {{1, 500}, {1, 0}, {1, 0}, {1, 130}, {20, 0}, {7, 300}};
  ps.num_decodes = 4;
  ps.num_q_heads = 4;
  ps.cache.num_kv_heads = 2;
  Problem pb = make_problem(ps, rng);
  // Token 0 (a real decode) loses its selection for head 1.
  std::fill_n(pb.topk.data() + 1 * ps.topk, ps.topk, -1);
  const Result res = run(pb);
  expect_matches_reference(pb, res);
  const int G = 2;
  auto expect_empty = [&](std::int32_t t, int kv_head) {
    for (int g = 0; g < G; ++g) {
      const std::size_t qh = std::size_t(t) * ps.num_q_heads + kv_head * G + g;
      EXPECT_EQ(res.lse[qh], -std::numeric_limits<float>::infinity()) << "t " << t << " q head " << qh;
      for (int d = 0; d < D; ++d) ASSERT_EQ(res.out[qh * D + d], 0) << "t " << t << " q head " << qh;
    }
  };
  expect_empty(0, 1);
  for (std::int32_t t : {1, 2}) expect_empty(t, 0), expect_empty(t, 1);
  for (std::int32_t t = pb.step.query_start[4]; t < pb.step.query_start[5]; ++t) expect_empty(t, 0), expect_empty(t, 1);

  // Only padding: nothing to read at all, still 0 and -inf.
  Problem pad = make_problem(ProblemSpec{{{1, 0}, {1, 0}}, 2, {}, 1, 16}, rng);
  const Result pr = run(pad);
  for (std::size_t i = 0; i < pr.out.size(); ++i) ASSERT_EQ(pr.out[i], 0);
  for (float l : pr.lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
}

// The order of the valid top-k entries does not change a single bit.
TEST(AttentionBatch, OrderOfEntriesDoesNotMatter) {
  const unsigned seed = 3400;
  SCOPED_TRACE("seed " + std::to_string(seed));
  ProblemSpec ps;
  ps.requests = {{1, 4000}, {1, 700}, {90, 2100}};
  ps.num_decodes = 2;
  ps.num_q_heads = 8;
  ps.cache.num_kv_heads = 2;
  ps.cache.dtype = DType::nvfp4;
  ps.topk = 24;
  std::mt19937 rng(seed);
  Problem sorted = make_problem(ps, rng);
  Problem shuffled = make_problem(ps, rng);  // same sizes, new data: overwrite with sorted's
  shuffled = sorted;
  shuffled.cache.view = sorted.cache.view;
  for (std::int32_t t = 0; t < sorted.step.view.num_tokens; ++t) {
    for (int h = 0; h < 2; ++h) {
      std::int32_t* row = shuffled.topk.data() + (std::size_t(t) * 2 + h) * ps.topk;
      const int valid = int(std::find(row, row + ps.topk, -1) - row);
      std::shuffle(row, row + valid, rng);
    }
  }
  ASSERT_NE(sorted.topk, shuffled.topk);
  const Result a = run(sorted), b = run(shuffled);
  EXPECT_TRUE(bit_equal(a, b));
  expect_matches_reference(shuffled, b);
}

// Requests that share a prefix page (block 0 of both is one physical page),
// the shorter one first: a block converted for the short request must not be
// reused with too few tokens for the long one.
TEST(AttentionBatch, SharedPrefixPage) {
  const unsigned seed = 3450;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ProblemSpec ps;
  ps.requests = {{1, 100}, {1, 300}, {60, 250}};
  ps.num_decodes = 2;
  ps.num_q_heads = 2;
  Problem pb = make_problem(ps, rng);
  const int mb = pb.cache.max_blocks;
  pb.cache.table[1 * mb] = pb.cache.table[0];
  pb.cache.table[2 * mb] = pb.cache.table[0];
  write_kv(pb.cache, pb.step, random_kv(pb.step, 1, rng));  // the longer requests fill the page
  msa::cpu::Options one;
  one.num_threads = 1;
  expect_matches_reference(pb, run(pb, one));
}

// Thread count, the optional lse and opt.check do not change the output.
TEST(AttentionBatch, ThreadsLseAndChecksDoNotChangeResult) {
  const unsigned seed = 3500;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ProblemSpec ps;
  ps.requests = {{1, 3000}, {300, 1900}};
  ps.num_decodes = 1;
  ps.num_q_heads = 16;
  ps.cache.dtype = DType::fp8_e5m2;
  ps.cache.scale_mode = ScaleMode::per_token_head;
  Problem pb = make_problem(ps, rng);
  msa::cpu::Options one;
  one.num_threads = 1;
  const Result want = run(pb, one);
  for (int threads : {2, 3, 7}) {
    msa::cpu::Options opt;
    opt.num_threads = threads;
    opt.check = threads != 3;
    EXPECT_TRUE(bit_equal(run(pb, opt), want)) << threads << " threads";
  }
  std::vector<std::uint16_t> out(want.out.size(), 0x7FFF);
  msa::cpu::attend(pb.step.view, pb.args(out.data(), nullptr));
  EXPECT_EQ(out, want.out);
}

}  // namespace
}  // namespace attn_test
