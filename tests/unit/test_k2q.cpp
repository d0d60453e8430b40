// build_k2q: the plan is exactly the inverse relation of the top-k lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "msa/batch.hpp"
#include "msa/error.hpp"
#include "msa/k2q.hpp"

namespace {

using V = std::vector<std::int32_t>;

// A random batch: decodes (some padding), then prefills with context (some
// padding, some without new tokens).
msa::BatchMetadata random_batch(std::mt19937& rng) {
  msa::BatchSpec s;
  const int dql = 1 + int(rng() % 4);
  s.decode_threshold = dql;
  const int decodes = int(rng() % 5), prefills = int(rng() % 4);
  for (int i = 0; i < decodes; ++i) {
    s.query_lens.push_back(dql);
    s.seq_lens.push_back(rng() % 6 == 0 ? 0 : dql + int(rng() % 2500));
  }
  for (int i = 0; i < prefills; ++i) {
    const int q = rng() % 8 == 0 ? 0 : dql + 1 + int(rng() % 300);
    s.query_lens.push_back(q);
    s.seq_lens.push_back(rng() % 8 == 0 ? 0 : q + int(rng() % 1500));
  }
  return msa::build_metadata(s);
}

// Random valid rows: a random number (0..eligible, at most topk) of distinct
// eligible ids in random order, then -1. Layout [token, head, topk] with
// token_stride/head_stride given by `head_major`.
struct RandomTopk {
  std::vector<std::int32_t> data;
  msa::TopkView view;
};
RandomTopk random_topk(std::mt19937& rng, const msa::BatchMetadata& m, int heads, int topk,
                       bool head_major) {
  RandomTopk out;
  out.data.assign(std::size_t(m.num_tokens) * heads * topk, -1);
  out.view.data = out.data.data();
  out.view.topk = topk;
  out.view.token_stride = head_major ? topk : std::int64_t(heads) * topk;
  out.view.head_stride = head_major ? std::int64_t(m.num_tokens) * topk : topk;
  for (int t = 0; t < m.num_tokens; ++t) {
    const int p = m.token_position[t];
    if (p < 0) continue;
    const int eligible = p / 128 + 1;
    for (int h = 0; h < heads; ++h) {
      std::int32_t* row = out.view.row(t, h);
      const int full = std::min(topk, eligible);
      const int n = rng() % 4 == 0 ? int(rng() % (full + 1)) : full;
      // n distinct ids from [0, eligible): partial Fisher-Yates over a small pool.
      V pool(eligible);
      std::iota(pool.begin(), pool.end(), 0);
      for (int k = 0; k < n; ++k) {
        std::swap(pool[k], pool[k + rng() % (eligible - k)]);
        row[k] = pool[k];
      }
    }
  }
  return out;
}

// Checks that `plan` is the inverse of topk over tokens [begin, end).
void expect_inverse(const msa::BatchMetadata& m, const msa::TopkView& topk, int heads, int begin,
                    int end, const msa::K2QPlan& plan) {
  const msa::StepView step = m.view();
  ASSERT_EQ(plan.num_kv_heads, heads);
  ASSERT_EQ(plan.topk, topk.topk);
  ASSERT_EQ(plan.row_start.size(), std::size_t(m.num_requests) + 1);
  ASSERT_EQ(plan.row_start[0], 0);
  for (int r = 0; r < m.num_requests; ++r)
    ASSERT_EQ(plan.row_start[r + 1] - plan.row_start[r], m.num_blocks(r)) << "r=" << r;
  ASSERT_EQ(plan.num_rows, plan.row_start[m.num_requests]);
  const std::int64_t rows = plan.num_rows * heads;
  ASSERT_EQ(plan.offsets.size(), std::size_t(rows) + 1);
  ASSERT_EQ(plan.offsets[0], 0);
  ASSERT_EQ(plan.tokens.size(), std::size_t(plan.offsets[rows]));
  ASSERT_EQ(plan.slots.size(), plan.tokens.size());
  ASSERT_EQ(plan.counts.size(), std::size_t(m.num_tokens) * heads);

  // The expected rows, built by brute force in ascending token order.
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> expected(rows);
  for (int t = 0; t < m.num_tokens; ++t) {
    const int r = step.token_request[t];
    for (int h = 0; h < heads; ++h) {
      int valid = 0;
      if (t >= begin && t < end) {
        for (int k = 0; k < topk.topk; ++k) {
          const int id = topk.row(t, h)[k];
          if (id < 0) continue;
          expected[h * plan.num_rows + plan.row_start[r] + id].emplace_back(t, k);
          ++valid;
        }
      }
      EXPECT_EQ(plan.counts[std::size_t(t) * heads + h], valid) << "t=" << t << " h=" << h;
    }
  }
  for (std::int64_t row = 0; row < rows; ++row) {
    ASSERT_LE(plan.offsets[row], plan.offsets[row + 1]) << "row " << row;
    std::vector<std::pair<std::int32_t, std::int32_t>> got;
    for (std::int64_t e = plan.offsets[row]; e < plan.offsets[row + 1]; ++e) {
      got.emplace_back(plan.tokens[e], plan.slots[e]);
      if (e > plan.offsets[row]) {
        EXPECT_LT(plan.tokens[e - 1], plan.tokens[e]) << "row " << row;
      }
    }
    ASSERT_EQ(got, expected[row]) << "row " << row;
  }
}

TEST(K2Q, RandomBatchesInvertExactly) {
  for (int trial = 0; trial < 200; ++trial) {
    const std::uint32_t seed = 7000 + trial;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const msa::BatchMetadata m = random_batch(rng);
    const int heads = 1 + int(rng() % 4);
    const int topk = 1 + int(rng() % 20);
    const bool head_major = rng() % 2;
    const RandomTopk tk = random_topk(rng, m, heads, topk, head_major);
    int begin = 0, end = m.num_tokens;
    if (trial % 3 == 1 && m.num_tokens > 0) {
      begin = int(rng() % (m.num_tokens + 1));
      end = begin + int(rng() % (m.num_tokens - begin + 1));
    }
    const msa::K2QPlan plan = trial % 3 == 0 ? msa::build_k2q(m.view(), tk.view, heads)
                                             : msa::build_k2q(m.view(), tk.view, heads, begin, end);
    expect_inverse(m, tk.view, heads, begin, end, plan);
  }
}

TEST(K2Q, LargeTopkFullRows) {
  // topk 64 on a long prefill: every row full, deterministic across builds.
  msa::BatchSpec s;
  s.query_lens = {1, 1, 700};
  s.seq_lens = {9000, 129, 9100};
  const msa::BatchMetadata m = msa::build_metadata(s);
  std::mt19937 rng(42);
  const RandomTopk tk = random_topk(rng, m, 4, 64, false);
  const msa::K2QPlan a = msa::build_k2q(m.view(), tk.view, 4);
  expect_inverse(m, tk.view, 4, 0, m.num_tokens, a);
  const msa::K2QPlan b = msa::build_k2q(m.view(), tk.view, 4);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.slots, b.slots);
}

TEST(K2Q, SmallExample) {
  // One prefill of 3 tokens at positions 200..202 (2 blocks), one head, topk 3.
  msa::BatchSpec s;
  s.query_lens = {3};
  s.seq_lens = {203};
  const msa::BatchMetadata m = msa::build_metadata(s);
  V data = {1, 0, -1,    // t=0
            0, -1, -1,   // t=1
            -1, -1, -1}; // t=2
  const msa::K2QPlan plan =
      msa::build_k2q(m.view(), msa::TopkView::token_major(data.data(), 1, 3), 1);
  EXPECT_EQ(plan.num_rows, 2);
  EXPECT_EQ(plan.offsets, (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_EQ(plan.tokens, (V{0, 1, 0}));
  EXPECT_EQ(plan.slots, (V{1, 0, 0}));
  EXPECT_EQ(plan.counts, (V{2, 1, 0}));
}

TEST(K2Q, EmptyAndPaddingBatches) {
  msa::BatchSpec s;
  const msa::BatchMetadata empty = msa::build_metadata(s);
  const msa::K2QPlan a = msa::build_k2q(empty.view(), msa::TopkView::token_major(nullptr, 2, 16), 2);
  EXPECT_EQ(a.num_rows, 0);
  EXPECT_EQ(a.offsets, std::vector<std::int64_t>{0});
  EXPECT_TRUE(a.tokens.empty());

  s.query_lens = {1, 1};
  s.seq_lens = {0, 0};
  const msa::BatchMetadata pad = msa::build_metadata(s);
  V data(2 * 2 * 16, -1);
  const msa::K2QPlan b =
      msa::build_k2q(pad.view(), msa::TopkView::token_major(data.data(), 2, 16), 2);
  EXPECT_EQ(b.num_rows, 0);
  EXPECT_EQ(b.counts, V(4, 0));
  EXPECT_TRUE(b.tokens.empty());
}

TEST(K2Q, RejectsBadTopk) {
  msa::BatchSpec s;
  s.query_lens = {3};
  s.seq_lens = {203};
  const msa::BatchMetadata m = msa::build_metadata(s);
  V data = {1, 0, -1, 0, 0, -1, -1, -1, -1};
  try {
    msa::build_k2q(m.view(), msa::TopkView::token_major(data.data(), 1, 3), 1);
    ADD_FAILURE() << "no error";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk[t=1, h=0, k=1] = 0 repeats topk[t=1, h=0, k=0]"),
              std::string::npos)
        << e.what();
  }
  // Outside the range the bad row is not read.
  EXPECT_NO_THROW(msa::build_k2q(m.view(), msa::TopkView::token_major(data.data(), 1, 3), 1, 2, 3));
}

}  // namespace
