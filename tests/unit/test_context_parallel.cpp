// Context parallelism on the CPU: N ranks simulated in one process must select
// exactly what the single-rank indexer selects, and their merged partial
// attention must equal the single-rank attention.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "msa/context_parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "msa/select.hpp"
#include "workload.hpp"

namespace {

using msa::cp::Candidate;
using msa::cp::Sharding;

// Random scores with many ties and some NaN, so the tie and NaN rules matter.
std::vector<float> random_scores(std::mt19937& rng, int n, float nan_share = 0.05f) {
  std::uniform_int_distribution<int> level(0, 12);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> s(n);
  for (auto& x : s) {
    const float r = u(rng);
    x = r < nan_share ? std::numeric_limits<float>::quiet_NaN() : float(level(rng)) * 0.5f;
  }
  return s;
}

// A rank's view of a row's scores: NaN for every block it does not own, as the
// indexer scores a block whose block-table entry is -1.
std::vector<float> rank_scores(const std::vector<float>& scores, const Sharding& sh, int rank) {
  std::vector<float> s = scores;
  for (std::size_t b = 0; b < s.size(); ++b)
    if (sh.owner(std::int32_t(b)) != rank) s[b] = std::numeric_limits<float>::quiet_NaN();
  return s;
}

// The selection numbers and sharding of trial `trial`: rows of up to 301
// blocks, topk 1, 2, 16 and 64, with and without an initial block and a
// second local one, 1 to 8 ranks, round-robin and runs of 1 to 13 blocks.
struct RowCase {
  int last, topk, init, local;
  Sharding sh;
};
RowCase row_case(std::mt19937& rng, int trial) {
  RowCase c;
  c.last = std::uniform_int_distribution<int>(0, 300)(rng);
  c.topk = std::vector<int>{1, 2, 16, 64}[trial % 4];
  c.init = trial % 3 == 0 ? 1 : 0;
  c.local = std::min(c.topk - c.init, trial % 5 == 0 ? 2 : 1);
  c.sh.num_ranks = 1 + trial % 8;
  c.sh.run_blocks = trial % 2 ? 0 : 1 + trial % 13;
  return c;
}

TEST(ContextParallel, MergedSelectionEqualsSingleRank) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    const auto [last, topk, init, local, sh] = row_case(rng, trial);
    const auto scores = random_scores(rng, last + 1);

    std::vector<std::int32_t> want(topk);
    msa::cpu::select_row(scores.data(), last, topk, init, local, want.data());

    std::vector<Candidate> cands(std::size_t(sh.num_ranks) * topk);
    for (int r = 0; r < sh.num_ranks; ++r)
      msa::cp::local_candidates(scores.data(), last, sh, r, topk, init, local, &cands[std::size_t(r) * topk]);
    std::vector<std::int32_t> got(topk, 7777);
    msa::cp::merge_candidates(cands.data(), sh.num_ranks, last, topk, init, local, got.data());
    ASSERT_EQ(got, want) << "trial " << trial << " last " << last << " topk " << topk << " ranks "
                         << sh.num_ranks << " run " << sh.run_blocks;

    // Each selected block is owned by exactly one rank.
    std::vector<std::int32_t> mine(topk);
    int total = 0;
    for (int r = 0; r < sh.num_ranks; ++r) {
      msa::cp::owned_entries(want.data(), topk, sh, r, mine.data());
      for (int k = 0; k < topk; ++k) {
        if (mine[k] < 0) {
          for (int k2 = k; k2 < topk; ++k2) ASSERT_EQ(mine[k2], -1);
          break;
        }
        ASSERT_EQ(sh.owner(mine[k]), r);
        ++total;
      }
    }
    int valid = 0;
    for (int k = 0; k < topk; ++k) valid += want[k] >= 0;
    ASSERT_EQ(total, valid);
  }
}

TEST(ContextParallel, MergePartialsIsExactSoftmaxSplit) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.0, 1.0);
  // One query row over 300 keys, split over 3 ranks by key ranges, one rank empty.
  const int nk = 300;
  std::vector<double> logit(nk), val(std::size_t(nk) * msa::kHeadDim);
  for (auto& x : logit) x = 3.0 * g(rng);
  for (auto& x : val) x = g(rng);
  auto partial = [&](int b, int e, std::vector<float>& out, float& lse) {
    out.assign(msa::kHeadDim, 0.0f);
    if (b >= e) { lse = -std::numeric_limits<float>::infinity(); return; }
    double m = -1e300, s = 0.0;
    for (int j = b; j < e; ++j) m = std::max(m, logit[j]);
    std::vector<double> acc(msa::kHeadDim, 0.0);
    for (int j = b; j < e; ++j) {
      const double w = std::exp(logit[j] - m);
      s += w;
      for (int d = 0; d < msa::kHeadDim; ++d) acc[d] += w * val[std::size_t(j) * msa::kHeadDim + d];
    }
    for (int d = 0; d < msa::kHeadDim; ++d) out[d] = float(acc[d] / s);
    lse = float(m + std::log(s));
  };
  std::vector<float> full, p0, p1, p2;
  float lf, l0, l1, l2;
  partial(0, nk, full, lf);
  partial(0, 120, p0, l0);
  partial(120, 120, p1, l1);  // empty rank
  partial(120, nk, p2, l2);
  const float* outs[3] = {p0.data(), p1.data(), p2.data()};
  const float* lses[3] = {&l0, &l1, &l2};
  std::vector<float> got(msa::kHeadDim);
  float lg;
  msa::cp::merge_partials(outs, lses, 3, 1, got.data(), &lg);
  EXPECT_NEAR(lg, lf, 1e-4);
  for (int d = 0; d < msa::kHeadDim; ++d) EXPECT_NEAR(got[d], full[d], 1e-5) << "d " << d;

  // All ranks empty: 0 and -inf, never NaN.
  const float ninf = -std::numeric_limits<float>::infinity();
  const float* lses_empty[3] = {&ninf, &ninf, &ninf};
  msa::cp::merge_partials(outs, lses_empty, 3, 1, got.data(), &lg);
  EXPECT_EQ(lg, ninf);
  for (float x : got) EXPECT_EQ(x, 0.0f);
}

// Candidates taken from each rank's own selection over its NaN-masked scores
// merge into the same global top-k, whatever the share of NaN and ties.
TEST(ContextParallel, CandidatesFromOwnTopkMergeToSingleRank) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 600; ++trial) {
    const auto [last, topk, init, local, sh] = row_case(rng, trial);
    const float nan_share = std::vector<float>{0.0f, 0.05f, 0.5f, 1.0f}[(trial / 4) % 4];
    const auto scores = random_scores(rng, last + 1, nan_share);

    std::vector<std::int32_t> want(topk);
    msa::cpu::select_row(scores.data(), last, topk, init, local, want.data());

    std::vector<Candidate> cands(std::size_t(sh.num_ranks) * topk);
    std::vector<std::int32_t> own(topk);
    for (int r = 0; r < sh.num_ranks; ++r) {
      const auto mine = rank_scores(scores, sh, r);
      msa::cpu::select_row(mine.data(), last, topk, init, local, own.data());
      Candidate* c = &cands[std::size_t(r) * topk];
      msa::cp::candidates_from_topk(mine.data(), own.data(), last, sh, r, topk, init, local, c);
      for (int k = 0; k < topk; ++k) {
        if (c[k].block < 0) {
          ASSERT_EQ(c[k].score, -std::numeric_limits<float>::infinity());
          continue;
        }
        ASSERT_EQ(sh.owner(c[k].block), r);
        ASSERT_FALSE(msa::select::is_forced(c[k].block, last, init, local));
      }
    }
    std::vector<std::int32_t> got(topk, 7777);
    msa::cp::merge_candidates(cands.data(), sh.num_ranks, last, topk, init, local, got.data());
    ASSERT_EQ(got, want) << "trial " << trial << " last " << last << " topk " << topk << " ranks "
                         << sh.num_ranks << " run " << sh.run_blocks << " NaN share " << nan_share;
  }
}

TEST(ContextParallel, CandidatesFromTopkRejectsBadArguments) {
  const std::vector<float> scores(8, 1.0f);
  const std::vector<std::int32_t> own = {0, 1, 2, 3};
  std::vector<Candidate> out(4);
  EXPECT_THROW(msa::cp::candidates_from_topk(scores.data(), own.data(), 7, Sharding{2, 0}, 2, 4, 0, 1,
                                             out.data()),
               msa::Error);
  EXPECT_THROW(msa::cp::candidates_from_topk(scores.data(), own.data(), 7, Sharding{2, 0}, 0, 0, 0, 1,
                                             out.data()),
               msa::Error);
  // Entries outside [0, last] are not candidates.
  const std::vector<std::int32_t> odd = {-1, 9, 2, 4};
  msa::cp::candidates_from_topk(scores.data(), odd.data(), 7, Sharding{2, 0}, 0, 4, 0, 1, out.data());
  EXPECT_EQ(out[0].block, 2);
  EXPECT_EQ(out[1].block, 4);
  EXPECT_EQ(out[2].block, -1);
}

// The whole layer on N simulated ranks: each rank's cache holds only the pages
// of the blocks it owns (the others are NaN), the ranks agree on the top-k by
// exchanging candidates, attend to their own blocks, and the lse-weighted merge
// equals the single-rank attention.
TEST(ContextParallel, ShardedLayerEqualsSingleRank) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  msa::WorkloadSpec spec;
  spec.model = msa::ModelConfig::minimax_m3(4);
  spec.model.num_kv_heads = 2;
  spec.model.num_q_heads = 8;
  spec.requests = {{2, 3000}, {2, 700}, {2, 5000}, {300, 2200}};
  spec.decode_threshold = 2;
  spec.seed = seed;
  msa::Workload w(spec);
  const auto opt = w.cpu_options();
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), opt);
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), opt);
  const auto step = w.step();
  const int T = w.num_tokens(), H = spec.model.num_kv_heads, K = spec.model.topk;
  const int Hq = spec.model.num_q_heads;

  // Single rank: index and attend.
  msa::cpu::index(step, w.indexer_args(), opt);
  const std::vector<std::int32_t> topk_single = w.topk;
  msa::cpu::attend(step, w.attention_args(), opt);
  const std::vector<std::uint8_t> out_single = w.out;
  const std::vector<float> lse_single = w.lse;

  std::vector<float> scores(std::size_t(T) * H * w.max_blocks);
  msa::cpu::block_scores(step, w.indexer_args(), scores.data(), w.max_blocks, opt);

  for (int ranks : {2, 3}) {
    for (int run : {0, 5}) {
      Sharding sh{ranks, run};
      SCOPED_TRACE(::testing::Message() << ranks << " ranks, run " << run);
      // Candidate exchange and merge.
      std::vector<std::int32_t> merged(std::size_t(T) * H * K);
      std::vector<Candidate> cands(std::size_t(ranks) * K);
      for (int t = 0; t < T; ++t) {
        const int p = step.position(t);
        for (int h = 0; h < H; ++h) {
          std::int32_t* row = &merged[(std::size_t(t) * H + h) * K];
          if (p < 0) { std::fill(row, row + K, -1); continue; }
          const float* s = &scores[(std::size_t(t) * H + h) * w.max_blocks];
          for (int r = 0; r < ranks; ++r)
            msa::cp::local_candidates(s, p / 128, sh, r, K, spec.model.init_blocks,
                                      spec.model.local_blocks, &cands[std::size_t(r) * K]);
          msa::cp::merge_candidates(cands.data(), ranks, p / 128, K, spec.model.init_blocks,
                                    spec.model.local_blocks, row);
        }
      }
      ASSERT_EQ(merged, topk_single);

      // Per-rank attention over a cache holding only the rank's own pages.
      std::vector<std::vector<float>> outs(ranks), lses(ranks);
      for (int r = 0; r < ranks; ++r) {
        std::vector<std::uint8_t> shard = w.kv_bytes;
        const std::int64_t page_bytes = msa::page_bytes_per_head(spec.kv_dtype) * H;
        for (int req = 0; req < w.num_requests(); ++req)
          for (int b = 0; b < w.meta().num_blocks(req); ++b)
            if (sh.owner(b) != r) {
              const auto view = w.kv_view();
              // Compact HND pages: the page's bytes start at page * page_stride elements.
              std::uint8_t* base = shard.data() + std::int64_t(w.page(req, b)) * view.page_stride * 2;
              std::fill(base, base + page_bytes, std::uint8_t(0xFF));  // bf16 NaN
            }
        std::vector<std::int32_t> mine(merged.size());
        for (std::size_t row = 0; row < merged.size() / K; ++row)
          msa::cp::owned_entries(&merged[row * K], K, sh, r, &mine[row * K]);
        auto args = w.attention_args();
        args.cache = w.kv_view_at(shard.data(), nullptr, nullptr);
        args.topk.data = mine.data();
        std::vector<std::uint16_t> out(std::size_t(T) * Hq * 128);
        lses[r].assign(std::size_t(T) * Hq, 0.0f);
        args.out = out.data();
        args.lse = lses[r].data();
        msa::cpu::attend(step, args, opt);
        outs[r].resize(out.size());
        for (std::size_t i = 0; i < out.size(); ++i) outs[r][i] = msa::num::bf16_to_float(out[i]);
      }
      std::vector<const float*> op(ranks), lp(ranks);
      for (int r = 0; r < ranks; ++r) { op[r] = outs[r].data(); lp[r] = lses[r].data(); }
      std::vector<float> out(std::size_t(T) * Hq * 128), lse(std::size_t(T) * Hq);
      msa::cp::merge_partials(op.data(), lp.data(), ranks, std::int64_t(T) * Hq, out.data(), lse.data());
      double num = 0, den = 0, lse_err = 0;
      const auto* single = reinterpret_cast<const std::uint16_t*>(out_single.data());
      for (std::size_t i = 0; i < out.size(); ++i) {
        const double want = msa::num::bf16_to_float(single[i]);
        ASSERT_TRUE(std::isfinite(out[i])) << "element " << i;
        num += (out[i] - want) * (out[i] - want);
        den += want * want;
      }
      for (std::size_t i = 0; i < lse.size(); ++i) {
        if (std::isinf(lse_single[i])) { ASSERT_EQ(lse[i], lse_single[i]) << "row " << i; continue; }
        lse_err = std::max(lse_err, double(std::fabs(lse[i] - lse_single[i])));
      }
      EXPECT_LE(std::sqrt(num / den), 1e-2);
      EXPECT_LE(lse_err, 1e-3);
    }
  }
}

}  // namespace
