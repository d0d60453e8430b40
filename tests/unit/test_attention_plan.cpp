// Host heuristics of the CUDA attention plan (src/cuda/attention/heuristics.hpp):
// split-K choice, token tiles and workspace layout. Pure functions, no device
// needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/widen/choice.hpp"

namespace {

using msa::cuda::attention::choose_splits;
using msa::cuda::attention::first_tile_number;
using msa::cuda::attention::kTileMaxPairs;
using msa::cuda::attention::kTileMaxTokens;
using msa::cuda::attention::kTileRows;
using msa::cuda::attention::tile_ctas;
using msa::cuda::attention::tile_tokens;
using msa::cuda::attention::use_token_tiles;
using msa::cuda::attention::choose_step_splits;
using msa::cuda::attention::kMaxSplits;
using msa::cuda::attention::Splits;

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

// Cluster capacities of the shape of the H200's (1 CTA per SM): fewer clusters
// of larger sizes.
msa::cuda::attention::ClusterCapacity h200_like_capacity() {
  msa::cuda::attention::ClusterCapacity c;
  const int clusters[] = {0, 0, 64, 40, 28, 24, 16, 16, 16};
  for (int s = 0; s <= msa::cuda::attention::kMaxClusterSplits; ++s) c.clusters[s] = clusters[s];
  return c;
}

TEST(AttentionPlan, ClusterMergeFavoursSplitsThatFitInOneWave) {
  namespace att = msa::cuda::attention;
  const att::ClusterCapacity cap = h200_like_capacity();
  // Decode batch 32 / 64 at one KV head: measured 17.0 us with 2 splits merged
  // in clusters against 18.0 us with 4 merged through the workspace.
  EXPECT_EQ(choose_splits(32, 16, kH200Sms), 4);       // no clusters: as before
  EXPECT_EQ(choose_splits(32, 16, kH200Sms, cap), 3);  // 32 clusters of 3 fit
  EXPECT_EQ(choose_splits(64, 16, kH200Sms, cap), 2);
  EXPECT_EQ(choose_splits(128, 16, kH200Sms, cap), 1);
  // Clusters that do not all fit pay the workspace merge.
  att::ClusterCapacity small = cap;
  small.clusters[3] = 20;
  EXPECT_EQ(choose_splits(32, 16, kH200Sms, small), 2);
  EXPECT_TRUE(cap.fits(3, 32));
  EXPECT_FALSE(small.fits(3, 32));
  EXPECT_FALSE(cap.fits(1, 1));
  EXPECT_FALSE(cap.fits(att::kMaxClusterSplits + 1, 1));
  // Small batches take the largest clusters that fit in one wave (measured on
  // the H200: 8 splits 11.1-11.2 us at 16 / 1 batch 1, against 12.4-12.6 with 4).
  EXPECT_EQ(choose_splits(1, 16, kH200Sms, cap), 8);
  EXPECT_EQ(choose_splits(8, 16, kH200Sms, cap), 8);
  EXPECT_EQ(choose_splits(16, 16, kH200Sms, cap), 8);
  att::ClusterCapacity huge;
  for (int s = 0; s <= att::kMaxClusterSplits; ++s) huge.clusters[s] = 1 << 20;
  for (std::int64_t rows : {1, 2, 8, 16, 24}) {
    const int s = choose_splits(rows, 16, kH200Sms, huge);
    EXPECT_LE(s, att::kMaxClusterSplits) << "rows " << rows;
    EXPECT_GT(s, 1) << "rows " << rows;
  }
  // Step splits pass the capacity to both classes.
  const Splits st = choose_step_splits(32 + 5, 32, 1, 16, kH200Sms, cap);
  EXPECT_EQ(st.decode, 3);
  EXPECT_GT(st.prefill, 1);
  EXPECT_LE(st.prefill, att::kMaxClusterSplits);
}

TEST(AttentionPlan, ConvertedCachesFillOneWave) {
  namespace att = msa::cuda::attention;
  const att::ClusterCapacity cap = h200_like_capacity();
  // fp8 / nvfp4 decode: the most splits within one wave, up to 8 (clusters of
  // more than 4 only when they fit at once).
  EXPECT_EQ(att::choose_converted_splits(1, 16, kH200Sms, cap), 8);
  EXPECT_EQ(att::choose_converted_splits(8, 16, kH200Sms, cap), 8);
  EXPECT_EQ(att::choose_converted_splits(32, 16, kH200Sms, cap), 4);
  EXPECT_EQ(att::choose_converted_splits(64, 16, kH200Sms, cap), 2);
  EXPECT_EQ(att::choose_converted_splits(128, 16, kH200Sms, cap), 1);
  EXPECT_EQ(att::choose_converted_splits(4096, 16, kH200Sms, cap), 1);
  EXPECT_EQ(att::choose_converted_splits(1, 3, kH200Sms, cap), 3);  // at most topk
  EXPECT_EQ(att::choose_converted_splits(1, 1, kH200Sms, cap), 1);
  EXPECT_EQ(att::choose_converted_splits(0, 16, kH200Sms, cap), 1);
  // Without cluster launches: at most 4 (the workspace merge).
  EXPECT_EQ(att::choose_converted_splits(1, 16, kH200Sms), 4);
  att::ClusterCapacity few = cap;
  few.clusters[8] = 4, few.clusters[7] = 4, few.clusters[6] = 8, few.clusters[5] = 8;
  EXPECT_EQ(att::choose_converted_splits(8, 16, kH200Sms, few), 6);
  // The fp8 and nvfp4 row kernels fit two CTAs per SM: twice the slots.
  EXPECT_EQ(att::row_kernel_ctas_per_sm(msa::DType::fp8_e4m3), 2);
  EXPECT_EQ(att::row_kernel_ctas_per_sm(msa::DType::nvfp4), 2);
  EXPECT_EQ(att::row_kernel_ctas_per_sm(msa::DType::bf16), 1);
  EXPECT_EQ(att::choose_converted_splits(8, 16, kH200Sms, cap, 2), 8);
  EXPECT_EQ(att::choose_converted_splits(32, 16, kH200Sms, cap, 2), 4);   // clusters of 5-8 do not fit
  EXPECT_EQ(att::choose_converted_splits(64, 16, kH200Sms, cap, 2), 4);
  EXPECT_EQ(att::choose_converted_splits(128, 16, kH200Sms, cap, 2), 2);
  // Steps: only the decode class uses it.
  const Splits st = choose_step_splits(32 + 5, 32, 1, 16, kH200Sms, cap, true);
  EXPECT_EQ(st.decode, 4);
  EXPECT_EQ(st.prefill, choose_step_splits(32 + 5, 32, 1, 16, kH200Sms, cap).prefill);
  // fp8 decode rows (converted false: their codes convert in one instruction
  // per pair) split as bf16 ones do, whatever their CTAs per SM.
  for (const std::int64_t rows : {1, 8, 32, 64, 128})
    EXPECT_EQ(choose_step_splits(rows, rows, 1, 16, kH200Sms, cap, false, 2).decode,
              choose_splits(rows, 16, kH200Sms, cap))
        << "rows " << rows;
  EXPECT_EQ(choose_step_splits(32, 32, 1, 16, kH200Sms, cap, false, 2).decode, 3);
  EXPECT_EQ(choose_step_splits(64, 64, 1, 16, kH200Sms, cap, false, 2).decode, 2);
}

TEST(AttentionPlan, TileSplitsFillTheLastRound) {
  namespace att = msa::cuda::attention;
  auto split = [](std::int64_t tiles, int sms, int heads = 1) {
    const att::TileSplit t = att::choose_tile_split(tiles, sms, heads);
    return std::pair{t.splits, t.from};
  };
  using P = std::pair<int, std::int64_t>;
  // Few tiles (at most half the SMs busy): every tile splits as far as the grid holds them.
  EXPECT_EQ(split(1, kH200Sms), P(4, 0));
  EXPECT_EQ(split(33, kH200Sms), P(4, 0));
  EXPECT_EQ(split(40, kH200Sms), P(3, 0));
  EXPECT_EQ(split(66, kH200Sms), P(2, 0));
  // One round more than half full, or full ones: no split.
  EXPECT_EQ(split(67, kH200Sms).first, 1);
  EXPECT_EQ(split(132, kH200Sms).first, 1);
  EXPECT_EQ(split(264, kH200Sms).first, 1);
  // A last round at most half full: only its tiles split, as far as they fill it.
  EXPECT_EQ(split(133, kH200Sms), P(4, 132));
  EXPECT_EQ(split(193, kH200Sms), P(2, 132));
  EXPECT_EQ(split(198, kH200Sms), P(2, 132));
  EXPECT_EQ(split(199, kH200Sms).first, 1);
  EXPECT_EQ(split(330, kH200Sms), P(2, 264));     // b=10 q=256 at 16/1: 2.5 rounds
  EXPECT_EQ(split(2 * 132 + 30, kH200Sms), P(4, 264));
  // Not after more than kMaxWholeRounds full rounds.
  EXPECT_EQ(split(3 * 132 + 30, kH200Sms).first, 1);
  EXPECT_EQ(split(2049, kH200Sms).first, 1);      // a 16K-token chunk (16/1)
  EXPECT_EQ(split(8196, kH200Sms, 4).first, 1);   // a 16K-token chunk (64/4): a last round of 12
  // The whole tiles end on a KV head boundary (a token's tiles split alike).
  EXPECT_EQ(split(2 * 130 + 20, 130, 4), P(4, 260));
  // The GPU test's last-round cases (CudaAttentionTiles.ShapeTileSplits).
  EXPECT_EQ(split(96, 40), P(2, 80));
  EXPECT_EQ(split(204, 96, 4), P(4, 192));
  EXPECT_EQ(att::tile_split_items(330, att::TileSplit{2, 264}), 264 + 66 * 2);
  EXPECT_EQ(att::tile_split_items(33, att::TileSplit{4, 0}), 132);
  EXPECT_EQ(att::tile_split_items(33, att::TileSplit{}), 33);
  EXPECT_EQ(split(0, kH200Sms).first, 1);
  EXPECT_EQ(split(10, 0).first, 1);
  EXPECT_EQ(split(10, kH200Sms, 0).first, 1);
}

TEST(AttentionPlan, TileTokensRespectTheTileLimits) {
  for (int group = 1; group <= 16; ++group) {
    for (int topk : {1, 2, 7, 16, 33, 64}) {
      SCOPED_TRACE(::testing::Message() << "group " << group << " topk " << topk);
      const int t = tile_tokens(group, topk);
      EXPECT_GE(t, 1);
      EXPECT_LE(t * group, kTileRows);
      EXPECT_LE(t, kTileMaxTokens);
      EXPECT_LE(t * topk, kTileMaxPairs);
      // As many tokens as the limits allow.
      EXPECT_TRUE((t + 1) * group > kTileRows || t + 1 > kTileMaxTokens || (t + 1) * topk > kTileMaxPairs);
    }
  }
  EXPECT_EQ(tile_tokens(16, 16), 8);   // 128 rows
  EXPECT_EQ(tile_tokens(16, 64), 8);   // 512 pairs
  EXPECT_EQ(tile_tokens(5, 16), 25);   // 125 rows
  EXPECT_EQ(tile_tokens(1, 16), 32);   // pairs bound
  EXPECT_EQ(tile_tokens(1, 1), 64);    // 64-bit token masks
}

TEST(AttentionPlan, TokenTilesOnlyForUnsplitPrefillWithEnoughRows) {
  EXPECT_TRUE(use_token_tiles(16, 16, 1));
  EXPECT_TRUE(use_token_tiles(16, 64, 1));
  EXPECT_TRUE(use_token_tiles(1, 16, 1));   // 32 tokens x 1 head
  EXPECT_FALSE(use_token_tiles(1, 64, 1));  // 8 rows: the row kernel
  EXPECT_FALSE(use_token_tiles(16, 16, 2)); // split prefill rows stay in the row kernel
  // A large prefill does not split, so it runs as token tiles at model shapes.
  const Splits s = choose_step_splits(32768, 0, 1, 16, kH200Sms);
  EXPECT_EQ(s.prefill, 1);
  EXPECT_TRUE(use_token_tiles(16, 16, s.prefill));
}

TEST(AttentionPlan, WgmmaTilesForWholeTokensPerWarpgroup) {
  namespace att = msa::cuda::attention;
  // MiniMax-M3 per-rank shapes (G 16) at top-k 16 and 64: 8 tokens x 16 rows.
  EXPECT_TRUE(att::use_wgmma_tiles(true, 16, tile_tokens(16, 16)));
  EXPECT_TRUE(att::use_wgmma_tiles(true, 16, tile_tokens(16, 64)));
  EXPECT_TRUE(att::use_wgmma_tiles(true, 8, tile_tokens(8, 32)));   // 16 tokens x 8
  EXPECT_TRUE(att::use_wgmma_tiles(true, 4, tile_tokens(4, 16)));   // 32 tokens x 4
  EXPECT_FALSE(att::use_wgmma_tiles(true, 8, tile_tokens(8, 64)));  // 8 tokens: 64 rows
  EXPECT_FALSE(att::use_wgmma_tiles(true, 12, tile_tokens(12, 16)));  // 120 rows, tokens across warpgroups
  EXPECT_FALSE(att::use_wgmma_tiles(true, 1, tile_tokens(1, 16)));  // 32 rows
  EXPECT_FALSE(att::use_wgmma_tiles(false, 16, tile_tokens(16, 16)));  // the caller's cache condition
}

// The device numbering of tiles (first_tile_number + j for the j-th tile of a
// request) never collides and stays below tile_ctas, for random batches.
TEST(AttentionPlan, TileNumbersAreDistinctAndInRange) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " (seed 12345)");
    const int decodes = int(rng() % 5), prefills = int(rng() % 6);
    const int decode_len = 1 + int(rng() % 3);
    const int tpt = 1 + int(rng() % 64);
    std::vector<int> query_start = {0};
    for (int r = 0; r < decodes; ++r) query_start.push_back(query_start.back() + decode_len);
    const int num_decode_tokens = query_start.back();
    for (int r = 0; r < prefills; ++r) query_start.push_back(query_start.back() + int(rng() % 300));
    const int requests = decodes + prefills;
    const int prefill_tokens = query_start.back() - num_decode_tokens;
    const std::int64_t limit = tile_ctas(prefill_tokens, requests, tpt, 1);
    std::set<std::int64_t> seen;
    std::int64_t tiles = 0;
    for (int r = 0; r < requests; ++r) {
      const int start = std::max(query_start[r], num_decode_tokens);
      const int tokens = query_start[r + 1] - start;
      for (int j = 0; j * tpt < tokens; ++j) {
        const std::int64_t number = first_tile_number(query_start[r], num_decode_tokens, tpt, r) + j;
        EXPECT_TRUE(seen.insert(number).second) << "tile " << number << " twice";
        EXPECT_LT(number, limit);
        ++tiles;
      }
      // Numbers grow with the request (the device search relies on it).
      if (r > 0) {
        EXPECT_LE(first_tile_number(query_start[r - 1], num_decode_tokens, tpt, r - 1),
                  first_tile_number(query_start[r], num_decode_tokens, tpt, r));
      }
    }
    if (prefill_tokens > 0) {
      EXPECT_GE(limit, tiles);
    } else {
      EXPECT_EQ(limit, 0);
    }
    EXPECT_EQ(tile_ctas(prefill_tokens, requests, tpt, 3), 3 * limit);
  }
}

}  // namespace

// Key-major runs only for prefill-only steps on the wgmma tiles over bf16 /
// fp16 pages (the cache's, or its blocks widened ahead): always when the caller's order is key-major, by the device's
// choice when it is automatic and the step is large, never for query-major.
TEST(AttentionPlan, KeyMajorModeFollowsTheOrderOnPrefillOnlyHalfSteps) {
  namespace att = msa::cuda::attention;
  using Mode = att::KeyMajorMode;
  constexpr int kQuery = 0, kKey = 1, kAuto = 2;
  const std::int64_t big = att::kKeyMajorMinTokens;
  EXPECT_EQ(att::key_major_mode(kQuery, true, true, 16384, 0, 4), Mode::off);
  EXPECT_EQ(att::key_major_mode(kKey, true, true, 7, 0, 1), Mode::always);
  EXPECT_EQ(att::key_major_mode(kAuto, true, true, big, 0, 1), Mode::device_choice);
  EXPECT_EQ(att::key_major_mode(kAuto, true, true, big - 1, 0, 1), Mode::off);
  for (int order : {kKey, kAuto}) {
    EXPECT_EQ(att::key_major_mode(order, false, true, big, 0, 1), Mode::off);   // no bf16 / fp16 pages
    EXPECT_EQ(att::key_major_mode(order, true, false, big, 0, 1), Mode::off);   // not on the wgmma tiles
    EXPECT_EQ(att::key_major_mode(order, true, true, big, 32, 1), Mode::off);   // decode rows in the step
    EXPECT_EQ(att::key_major_mode(order, true, true, big, 0, att::kKeyMajorMaxRequests + 1), Mode::off);
    EXPECT_EQ(att::key_major_mode(order, true, true, 0, 0, 1), Mode::off);
    EXPECT_EQ(att::key_major_mode(order, true, true, att::kKeyMajorMaxTokens + 1, 0, 1), Mode::off);  // release count
  }
  // The tuning's threshold (tests: the device chooses at any size).
  EXPECT_EQ(att::key_major_mode(kAuto, true, true, 7, 0, 1, 0), Mode::device_choice);
  EXPECT_EQ(att::key_major_mode(kAuto, true, true, 7, 0, 1, 8), Mode::off);
  EXPECT_EQ(att::key_major_mode(kAuto, false, true, 7, 0, 1, 0), Mode::off);
  EXPECT_EQ(att::key_major_mode(kQuery, true, true, 7, 0, 1, 0), Mode::off);
}

// The device's choice: key-major when the token tiles would run more than
// kKeyMajorItemCost rounds per key-major item (random selections: ~100 union
// blocks per 8-token tile against ~4 items of 4 tokens per token), or when
// forced.
TEST(AttentionPlan, KeyMajorPreferredWhenTilesLoadManyBlocks) {
  namespace att = msa::cuda::attention;
  const std::int64_t tokens = 16384, items = 4 * tokens + 512;
  EXPECT_TRUE(att::prefer_key_major(tokens / 8 * 105, items, false));   // random
  EXPECT_FALSE(att::prefer_key_major(tokens / 8 * 17, items, false));   // clustered
  // Partly shared selections: the orders cross at about 1.04-1.16 rounds an item.
  EXPECT_TRUE(att::prefer_key_major(114, 100, false));
  EXPECT_FALSE(att::prefer_key_major(100, 100, false));
  EXPECT_TRUE(att::prefer_key_major(0, items, true));
  EXPECT_FALSE(att::prefer_key_major(100, 0, false));  // nothing to run key-major
}

// A key-major item is one consumer warpgroup's 64 query rows: 4 tokens at
// G = 16, at most 32 (the wgmma tiles that key-major runs on need G >= 2).
TEST(AttentionPlan, KeyMajorItemsHoldOneWarpgroupsRows) {
  namespace att = msa::cuda::attention;
  EXPECT_EQ(att::key_major_item_tokens(16), 4);
  for (int g : {2, 4, 8, 16, 32, 64}) EXPECT_EQ(att::key_major_item_tokens(g) * g, att::kKeyMajorRows) << g;
  EXPECT_EQ(att::key_major_item_tokens(2), 32);
}

// The work items fit their bound.
TEST(AttentionPlan, KeyMajorItemBound) {
  namespace att = msa::cuda::attention;
  const int T = 8;
  // Rows of 1, T, T + 1 and 5T - 3 edges: items 1 + 1 + 2 + 5.
  const std::int64_t edges = 1 + T + (T + 1) + (5 * T - 3);
  EXPECT_GE(att::key_major_max_items(edges, 4, T), 9);
}

// fp8 / nvfp4 token tiles widen their step's blocks ahead: room for the bound
// on the selected (request, block) pages, per prefill request min(blocks,
// query_len x topk x KV heads), each of every KV head, capped by widen_bytes
// (gated when capped), with room for the pages' scales with per-token fp8
// scales; bf16 / fp16 caches, steps without wgmma tiles and widen_bytes 0
// never widen.
TEST(AttentionPlan, WidenRoomFollowsTheBoundAndTheLimit) {
  namespace att = msa::cuda::attention;
  using msa::DType;
  const std::vector<std::int32_t> query_lens = {256, 10, 0}, blocks = {514, 3, 7};
  const att::WidenChoice c = att::choose_widen(DType::fp8_e4m3, false, true, -1, 4, 16, 5, query_lens, blocks);
  EXPECT_EQ(c.pages, 514 + 3);
  EXPECT_FALSE(c.gated);
  EXPECT_EQ(c.first_request, 5);
  EXPECT_EQ(c.requests, 3);
  EXPECT_EQ(c.block_cap, 514);  // (the request without tokens counts for nothing)
  EXPECT_FALSE(c.scales);
  // Short rows: query_len x topk x heads below the blocks.
  EXPECT_EQ(att::choose_widen(DType::nvfp4, false, true, -1, 2, 2, 0, {3}, {100}).pages, 12);
  // A limit below the bound: that many pages of every head, gated.
  const att::WidenChoice capped = att::choose_widen(DType::fp8_e5m2, false, true,
                                                    100 * 4 * att::kWidenHeadBytes + 5, 4, 16, 0, query_lens, blocks);
  EXPECT_EQ(capped.pages, 100);
  EXPECT_TRUE(capped.gated);
  // The default limit: 1 GiB.
  EXPECT_EQ(att::choose_widen(DType::fp8_e4m3, false, true, -1, 4, 16, 0, {20000}, {20000}).pages,
            att::kDefaultWidenBytes / (4 * att::kWidenHeadBytes));
  // Never: other caches, no wgmma tiles, widen_bytes 0 or below one page, no prefill.
  EXPECT_EQ(att::choose_widen(DType::bf16, false, true, -1, 4, 16, 0, query_lens, blocks).pages, 0);
  EXPECT_EQ(att::choose_widen(DType::fp8_e4m3, false, false, -1, 4, 16, 0, query_lens, blocks).pages, 0);
  EXPECT_EQ(att::choose_widen(DType::fp8_e4m3, false, true, 0, 4, 16, 0, query_lens, blocks).pages, 0);
  EXPECT_EQ(
      att::choose_widen(DType::fp8_e4m3, false, true, 4 * att::kWidenHeadBytes - 1, 4, 16, 0, query_lens, blocks).pages,
      0);
  EXPECT_EQ(att::choose_widen(DType::fp8_e4m3, false, true, -1, 4, 16, 0, {}, {}).pages, 0);
  // fp8 with per-token scales: the pages carry them (kWidenScaleBytes per
  // head), and the limit counts them; nvfp4 has none.
  const att::WidenChoice scaled = att::choose_widen(DType::fp8_e4m3, true, true, -1, 4, 16, 0, query_lens, blocks);
  EXPECT_EQ(scaled.pages, 514 + 3);
  EXPECT_TRUE(scaled.scales);
  const std::int64_t scaled_page = 4 * (att::kWidenHeadBytes + att::kWidenScaleBytes);
  EXPECT_EQ(att::choose_widen(DType::fp8_e5m2, true, true, 100 * scaled_page + 5, 4, 16, 0, query_lens, blocks).pages,
            100);
  EXPECT_EQ(att::choose_widen(DType::fp8_e5m2, true, true, 100 * scaled_page - 1, 4, 16, 0, query_lens, blocks).pages,
            99);
  const att::WidenChoice fp4 = att::choose_widen(DType::nvfp4, true, true, -1, 4, 16, 0, query_lens, blocks);
  EXPECT_GT(fp4.pages, 0);
  EXPECT_FALSE(fp4.scales);
}
