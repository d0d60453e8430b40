// Host heuristics of the CUDA attention plan (src/cuda/attention/heuristics.hpp):
// split-K choice and workspace layout. Pure functions, no device needed.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/attention/heuristics.hpp"

namespace {

using msa::cuda::attention::choose_splits;
using msa::cuda::attention::choose_step_splits;
using msa::cuda::attention::kMaxSplits;
using msa::cuda::attention::Splits;
using msa::cuda::attention::workspace_layout;

constexpr int kH200Sms = 132;

TEST(AttentionPlan, SmallDecodeBatchesSplitWide) {
  // batch 1..8 decode at one KV head (TP4/TP8): 8..16 splits.
  for (int batch = 1; batch <= 8; ++batch) {
    SCOPED_TRACE(::testing::Message() << "batch " << batch);
    const int s = choose_splits(batch, 16, kH200Sms);
    EXPECT_GE(s, 8);
    EXPECT_LE(s, 16);
  }
  EXPECT_EQ(choose_splits(1, 16, kH200Sms), 16);
}

TEST(AttentionPlan, SplitsFillTheMachineWithoutExtraWaves) {
  for (std::int64_t rows : {1, 2, 3, 7, 16, 32, 33, 64, 100, 128, 129, 256, 1000}) {
    for (int topk : {1, 2, 16, 17, 64}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " topk " << topk);
      const int s = choose_splits(rows, topk, kH200Sms);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, std::min(topk, kMaxSplits));
      // Splitting never makes the busiest SM read more blocks than no split.
      const auto waves = [&](int k) { return (rows * k + kH200Sms - 1) / kH200Sms; };
      EXPECT_LE(waves(s) * ((topk + s - 1) / s), waves(1) * topk);
    }
  }
}

TEST(AttentionPlan, LargeBatchesAndPrefillDoNotSplit) {
  EXPECT_EQ(choose_splits(128, 16, kH200Sms), 1);   // batch 32 x 4 KV heads
  EXPECT_EQ(choose_splits(4096, 16, kH200Sms), 1);  // a prefill chunk
  EXPECT_EQ(choose_splits(1 << 20, 64, kH200Sms), 1);
  EXPECT_EQ(choose_splits(0, 16, kH200Sms), 1);
  EXPECT_EQ(choose_splits(5, 1, kH200Sms), 1);  // one block: nothing to split
}

TEST(AttentionPlan, SplitsShrinkAsTheBatchGrows) {
  int previous = kMaxSplits;
  for (std::int64_t rows = 1; rows <= 512; rows *= 2) {
    const int s = choose_splits(rows, 16, kH200Sms);
    EXPECT_LE(s, previous) << "rows " << rows;
    previous = s;
  }
}

TEST(AttentionPlan, StepSplitsJudgeDecodeAndPrefillApart) {
  const Splits a = choose_step_splits(/*tokens*/ 4 + 3000, /*decode*/ 4, /*kv heads*/ 1, 16, kH200Sms);
  EXPECT_GE(a.decode, 8);
  EXPECT_EQ(a.prefill, 1);
  const Splits b = choose_step_splits(0, 0, 1, 16, kH200Sms);
  EXPECT_EQ(b.decode, 1);
  EXPECT_EQ(b.prefill, 1);
  const Splits c = choose_step_splits(3, 0, 1, 16, kH200Sms);  // a tiny prefill
  EXPECT_EQ(c.decode, 1);
  EXPECT_GT(c.prefill, 1);
}

TEST(AttentionPlan, WorkspaceLayout) {
  // Nothing splits: no workspace.
  const auto none = workspace_layout(100, 10, 16, 1, Splits{1, 1});
  EXPECT_EQ(none.bytes, 0u);
  EXPECT_EQ(none.max_splits, 1);

  // Only decode rows split: partials cover the decode tokens only.
  const auto dec = workspace_layout(1000, 10, 16, 2, Splits{4, 1});
  EXPECT_EQ(dec.partial_tokens, 10);
  EXPECT_EQ(dec.max_splits, 4);
  EXPECT_EQ(dec.out_offset, 0u);
  EXPECT_GE(dec.lse_offset, std::size_t(10) * 16 * 4 * 128 * sizeof(float));
  EXPECT_EQ(dec.lse_offset % 256, 0u);
  EXPECT_GE(dec.counter_offset, dec.lse_offset + std::size_t(10) * 16 * 4 * sizeof(float));
  EXPECT_EQ(dec.counter_offset % 256, 0u);
  EXPECT_EQ(dec.counter_bytes, std::size_t(10) * 2 * sizeof(std::int32_t));  // per (token, KV head)
  EXPECT_GE(dec.bytes, dec.counter_offset + dec.counter_bytes);
  EXPECT_EQ(dec.bytes % 256, 0u);

  // Prefill rows split too: every token has partials, sized by the larger factor.
  const auto both = workspace_layout(7, 3, 5, 5, Splits{2, 3});
  EXPECT_EQ(both.partial_tokens, 7);
  EXPECT_EQ(both.max_splits, 3);
  EXPECT_GE(both.bytes, std::size_t(7) * 5 * 3 * 129 * sizeof(float));
}

}  // namespace
