// For p < 16 * 128 every eligible block fits in a top-k of 16, so sparse
// attention with all of them selected must equal dense causal attention: the
// oracle here is ref::causal_attention, with no block or top-k logic at all.
#include "test_attention_common.hpp"

namespace attn_test {
namespace {

// Engine output of every query head against dense causal attention over the
// request's dequantized K/V (read by the cache reader).
void expect_dense_causal(Problem& pb, const Result& res) {
  const Step& s = pb.step;
  const int H = pb.cache.spec.num_kv_heads, G = pb.num_q_heads / H;
  const msa::AttentionArgs a = pb.args(nullptr, nullptr);
  const std::vector<double> q = msa::ref::read_query(a, s.view.num_tokens);
  std::vector<double> want_out(res.out.size()), want_lse(res.lse.size());
  for (std::int32_t r = 0; r < s.view.num_requests; ++r) {
    const std::int32_t q0 = s.query_start[r], nq = s.query_start[r + 1] - q0;
    const std::int32_t seq = s.seq_lens[r];
    for (int h = 0; h < H; ++h) {
      const auto kv = msa::ref::read_kv(a.cache, a.block_table, r, h, seq);
      for (int g = 0; g < G; ++g) {
        // Rows of one query head: gather, attend, scatter.
        std::vector<double> qg(std::size_t(nq) * D), og(std::size_t(nq) * D), lg(nq);
        for (int i = 0; i < nq; ++i) {
          const std::size_t qh = std::size_t(q0 + i) * pb.num_q_heads + h * G + g;
          std::copy_n(q.data() + qh * D, D, qg.data() + std::size_t(i) * D);
        }
        msa::ref::causal_attention(qg.data(), kv.k.data(), kv.v.data(), nq, seq, seq - nq,
                                   a.softmax_scale, og.data(), lg.data());
        for (int i = 0; i < nq; ++i) {
          const std::size_t qh = std::size_t(q0 + i) * pb.num_q_heads + h * G + g;
          std::copy_n(og.data() + std::size_t(i) * D, D, want_out.data() + qh * D);
          want_lse[qh] = lg[i];
        }
      }
    }
  }
  const auto c = msa::ref::compare_rows(out_as_double(pb, res), want_out, std::int64_t(pb.num_q_heads) * D, "out");
  EXPECT_TRUE(c.rel_ok(1e-2)) << c.describe();
  const auto l = msa::ref::compare_lse(lse_as_double(res), want_lse, "lse");
  EXPECT_TRUE(l.abs_ok(1e-3)) << l.describe();
}

TEST(AttentionCausal, EveryPositionBelow2048) {
  const unsigned seed = 1001;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ProblemSpec ps;
  ps.requests = {{2048, 2048}};
  ps.num_q_heads = 2;
  ps.topk = 16;
  ps.pick = Pick::all;
  Problem pb = make_problem(ps, rng);
  const Result res = run(pb);
  expect_dense_causal(pb, res);
}

// Chunked prefill (cached context before the new tokens), decodes and verify
// rows in one batch, GQA 8, two KV heads, fp16.
TEST(AttentionCausal, MixedBatchWithContext) {
  const unsigned seed = 1002;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  ProblemSpec ps;
  ps.requests = {{2, 2047}, {2, 129}, {2, 2}, {200, 2000}, {129, 129}, {1, 1}};
  ps.num_decodes = 3;
  ps.cache.dtype = DType::fp16;
  ps.cache.num_kv_heads = 2;
  ps.q_dtype = ps.out_dtype = DType::fp16;
  ps.num_q_heads = 16;
  ps.topk = 16;
  ps.pick = Pick::all;
  Problem pb = make_problem(ps, rng);
  const Result res = run(pb);
  expect_dense_causal(pb, res);
}

}  // namespace
}  // namespace attn_test
