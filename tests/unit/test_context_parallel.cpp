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

namespace {

using msa::cp::Candidate;
using msa::cp::Sharding;

// Random scores with many ties and some NaN, so the tie and NaN rules matter.
std::vector<float> random_scores(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> level(0, 12);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> s(n);
  for (auto& x : s) {
    const float r = u(rng);
    x = r < 0.05f ? std::numeric_limits<float>::quiet_NaN() : float(level(rng)) * 0.5f;
  }
  return s;
}

TEST(ContextParallel, MergedSelectionEqualsSingleRank) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    const int last = std::uniform_int_distribution<int>(0, 300)(rng);
    const int topk = std::vector<int>{1, 2, 16, 64}[trial % 4];
    const int init = trial % 3 == 0 ? 1 : 0;
    const int local = std::min(topk - init, trial % 5 == 0 ? 2 : 1);
    Sharding sh;
    sh.num_ranks = 1 + trial % 8;
    sh.run_blocks = trial % 2 ? 0 : 1 + trial % 13;
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

}  // namespace
