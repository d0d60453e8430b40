// The pure host pieces of `msa check` and `msa bench` (tools/msa/cuda/*.hpp):
// FLOP and byte accounting, case lists, synthetic top-k lists, page maps,
// rotation, timing summary and the comparison rules. No CUDA here.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../../tools/msa/cuda/bench_accounting.hpp"
#include "../../tools/msa/cuda/bench_choice.hpp"
#include "../../tools/msa/cuda/bench_directed.hpp"
#include "../../tools/msa/cuda/bench_sets.hpp"
#include "../../tools/msa/cuda/bench_topk.hpp"
#include "../../tools/msa/cuda/check_cases.hpp"
#include "../../tools/msa/cuda/check_compare.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"

namespace {

using namespace msa;
using namespace msa::tool;

std::vector<std::int32_t> starts(const std::vector<std::int32_t>& qlens) {
  std::vector<std::int32_t> s{0};
  for (const auto q : qlens) s.push_back(s.back() + q);
  return s;
}

TEST(BenchAccounting, RowKeysCountsCausalLimit) {
  const std::vector<std::int32_t> ids{0, 2, -1};
  // p = 300: block 0 whole (128), block 2 from 256 to 300 (45).
  EXPECT_EQ(row_keys(ids.data(), 3, 300, 301), 128 + 45);
  // p in block 0 itself: only the first p + 1 keys.
  const std::vector<std::int32_t> local{0};
  EXPECT_EQ(row_keys(local.data(), 1, 5, 6), 6);
  // seq_len also limits (defensive): keys below seq_len only.
  EXPECT_EQ(row_keys(ids.data(), 3, 300, 260), 128 + 4);
  // Padding rows attend nothing.
  EXPECT_EQ(row_keys(ids.data(), 3, -1, 0), 0);
  // Blocks beyond p contribute nothing.
  const std::vector<std::int32_t> late{3};
  EXPECT_EQ(row_keys(late.data(), 1, 300, 301), 0);
}

TEST(BenchAccounting, BlockBytesMatchPageBytes) {
  EXPECT_EQ(kv_block_bytes(DType::bf16, ScaleMode::none), page_bytes_per_head(DType::bf16));
  EXPECT_EQ(kv_block_bytes(DType::fp16, ScaleMode::none), 65536);
  EXPECT_EQ(kv_block_bytes(DType::fp8_e4m3, ScaleMode::per_tensor), 32768);
  EXPECT_EQ(kv_block_bytes(DType::fp8_e5m2, ScaleMode::per_token_head), 32768 + 1024);
  EXPECT_EQ(kv_block_bytes(DType::nvfp4, ScaleMode::per_tensor), 18432);
}

TEST(BenchAccounting, AttendTrafficByHand) {
  // One request, seq 300, two new tokens (p = 298, 299), two KV heads, group 3, topk 2.
  const std::vector<std::int32_t> qs = starts({2}), seq{300};
  // [token][head][k]
  const std::vector<std::int32_t> topk{0, 2,   1, 2,    // token 0 (p 298)
                                       0, 2,   0, 2};   // token 1 (p 299)
  const Traffic t = attend_traffic(qs, seq, topk, 2, 3, 2, 1000);
  // Block 2 holds 256..: p 298 sees 43 keys, p 299 sees 44.
  const std::int64_t keys = (128 + 43) + (128 + 43) + (128 + 44) + (128 + 44);
  EXPECT_EQ(t.keys, keys * 3);
  EXPECT_DOUBLE_EQ(t.flops, 4.0 * 128 * double(keys * 3));
  // Head 0 reads {0, 2}, head 1 reads {1, 2, 0}: 5 distinct (request, head, block).
  EXPECT_EQ(t.blocks, 5);
  EXPECT_DOUBLE_EQ(t.bytes, 5000.0);
}

TEST(BenchAccounting, ReadBlocksAreTheCountedBlocks) {
  // The AttendTrafficByHand step, then MultiRequestPrefillByHand's: the read
  // floor gathers exactly the blocks the traffic counts, in first-use order.
  using Blocks = std::vector<std::array<std::int32_t, 3>>;
  auto read = [](const std::vector<std::int32_t>& qs, const std::vector<std::int32_t>& seq,
                 const std::vector<std::int32_t>& topk, int heads, int k) {
    Blocks out;
    for_each_read_block(qs, seq, topk, heads, k, [&](std::int32_t r, int h, std::int32_t b) {
      out.push_back({r, h, b});
    });
    return out;
  };
  const Blocks one = read(starts({2}), {300}, {0, 2, 1, 2, 0, 2, 0, 2}, 2, 2);
  EXPECT_EQ(one, (Blocks{{0, 0, 0}, {0, 0, 2}, {0, 1, 1}, {0, 1, 2}, {0, 1, 0}}));
  const Blocks two = read(starts({2, 2}), {130, 130}, {0, 1, 0, 1, 1, -1, 0, 1}, 1, 2);
  EXPECT_EQ(two, (Blocks{{0, 0, 0}, {0, 0, 1}, {1, 0, 1}, {1, 0, 0}}));
  // Padding and ineligible ids read nothing.
  EXPECT_TRUE(read(starts({1, 1}), {0, 129}, {-1, -1, 1, -1}, 1, 2) == (Blocks{{1, 0, 1}}));
}

TEST(BenchAccounting, AttendTrafficSkipsPaddingAndInvalid) {
  const std::vector<std::int32_t> qs = starts({1, 1}), seq{0, 129};
  const std::vector<std::int32_t> topk{-1, -1,   // padding request
                                       1, -1};  // p = 128: block 1 has one key
  const Traffic t = attend_traffic(qs, seq, topk, 1, 16, 2, 64);
  EXPECT_EQ(t.keys, 16);
  EXPECT_EQ(t.blocks, 1);
}

TEST(BenchAccounting, MultiRequestPrefillByHand) {
  // Two prefill requests of 2 new tokens on 128 cached ones (seq 130, p = 128, 129),
  // one KV head, group 2, topk 2. Both select blocks 0 and 1: the same ids in
  // another request are other memory, so each request counts its blocks.
  const std::vector<std::int32_t> qs = starts({2, 2}), seq{130, 130};
  const std::vector<std::int32_t> topk{0, 1,    // request 0, p 128
                                       0, 1,    // request 0, p 129
                                       1, -1,   // request 1, p 128
                                       0, 1};   // request 1, p 129
  const Traffic t = attend_traffic(qs, seq, topk, 1, 2, 2, 1000);
  const std::int64_t keys = (128 + 1) + (128 + 2) + 1 + (128 + 2);
  EXPECT_EQ(t.keys, keys * 2);
  EXPECT_DOUBLE_EQ(t.flops, 4.0 * 128 * double(keys * 2));
  EXPECT_EQ(t.blocks, 4);
  EXPECT_DOUBLE_EQ(t.bytes, 4000.0);
  const Traffic ix = index_traffic(qs, seq, 3, DType::bf16, true);
  EXPECT_EQ(ix.keys, 2 * (129 + 130) * 3);
  EXPECT_EQ(ix.blocks, 2 * 2);
}

TEST(BenchAccounting, IndexTraffic) {
  const std::vector<std::int32_t> qs = starts({1, 3}), seq{129, 1000};
  const Traffic t = index_traffic(qs, seq, 4, DType::bf16, true);
  const std::int64_t keys = (129 + 998 + 999 + 1000) * 4;
  EXPECT_EQ(t.keys, keys);
  EXPECT_DOUBLE_EQ(t.flops, 2.0 * 128 * double(keys));
  EXPECT_EQ(t.blocks, 2 + 8);
  EXPECT_DOUBLE_EQ(t.bytes, 10.0 * 128 * 128 * 2);
  EXPECT_DOUBLE_EQ(t.fp8_flops, 0.0);
  const Traffic fp8 = index_traffic(qs, seq, 4, DType::fp8_e4m3, true);
  EXPECT_DOUBLE_EQ(fp8.bytes, 10.0 * 128 * 128);
  // The prefill kernel multiplies e4m3 keys on fp8 tensor cores; decode widens them.
  EXPECT_DOUBLE_EQ(fp8.fp8_flops, fp8.flops);
  EXPECT_DOUBLE_EQ(index_traffic(qs, seq, 4, DType::fp8_e4m3, false).fp8_flops, 0.0);
}

// Every row follows the contract: min(topk, last + 1) distinct ascending ids in
// [0, last] including last, then -1.
void expect_valid_rows(const std::vector<std::int32_t>& qs, const std::vector<std::int32_t>& seq,
                       const std::vector<std::int32_t>& ids, int heads, int topk) {
  for (std::size_t r = 0; r + 1 < qs.size(); ++r) {
    const std::int32_t qlen = qs[r + 1] - qs[r];
    for (std::int32_t i = 0; i < qlen; ++i) {
      for (int h = 0; h < heads; ++h) {
        SCOPED_TRACE(::testing::Message() << "request " << r << " token " << i << " head " << h);
        const std::int32_t* row = ids.data() + (std::int64_t(qs[r] + i) * heads + h) * topk;
        const std::int32_t p = token_position(seq[r], qlen, i);
        const std::int32_t valid = p < 0 ? 0 : std::min(topk, p / 128 + 1);
        for (int k = 0; k < topk; ++k) {
          if (k >= valid) {
            ASSERT_EQ(row[k], -1) << "k " << k;
            continue;
          }
          ASSERT_GE(row[k], 0);
          ASSERT_LE(row[k], p / 128);
          if (k > 0) {
            ASSERT_LT(row[k - 1], row[k]);
          }
        }
        if (valid > 0) {
          ASSERT_EQ(row[valid - 1], p / 128);
        }
      }
    }
  }
}

TEST(BenchTopk, RowsAreValid) {
  for (const TopkPattern pattern : {TopkPattern::random, TopkPattern::clustered, TopkPattern::partial}) {
    for (const int topk : {1, 16, 64}) {
      const std::vector<std::int32_t> qlens{4, 4, 4, 4}, seq{4, 129, 2049, 131072};
      const auto qs = starts(qlens);
      const auto ids = make_bench_topk(qs, seq, 3, topk, false, pattern, 11);
      expect_valid_rows(qs, seq, ids, 3, topk);
      const std::vector<std::int32_t> pq{300}, pseq{5000};
      const auto pids = make_bench_topk(starts(pq), pseq, 2, topk, true, pattern, 12);
      expect_valid_rows(starts(pq), pseq, pids, 2, topk);
    }
  }
}

TEST(BenchTopk, DeterministicAndVerifyRowsShareBlocks) {
  const std::vector<std::int32_t> qlens{4}, seq{131072};
  const auto qs = starts(qlens);
  const auto a = make_bench_topk(qs, seq, 1, 16, false, TopkPattern::random, 5);
  EXPECT_EQ(a, make_bench_topk(qs, seq, 1, 16, false, TopkPattern::random, 5));
  EXPECT_NE(a, make_bench_topk(qs, seq, 1, 16, false, TopkPattern::random, 6));
  // Four verify rows of 16 ids over 1024 blocks: far fewer than 64 distinct.
  const std::set<std::int32_t> distinct(a.begin(), a.end());
  EXPECT_LT(distinct.size(), 40u);
  EXPECT_GE(distinct.size(), 16u);
}

TEST(BenchTopk, ClusteredPrefillNeighboursShareBlocks) {
  const std::vector<std::int32_t> qlens{512}, seq{32768 + 512};
  const auto qs = starts(qlens);
  const auto clustered = make_bench_topk(qs, seq, 1, 16, true, TopkPattern::clustered, 9);
  const auto random = make_bench_topk(qs, seq, 1, 16, true, TopkPattern::random, 9);
  expect_valid_rows(qs, seq, clustered, 1, 16);
  // The union over 8 consecutive tokens: close to 16 when clustered, close to
  // 8 x 15 + 1 when random.
  auto union_of_8 = [](const std::vector<std::int32_t>& ids, int t0) {
    return std::set<std::int32_t>(ids.begin() + t0 * 16, ids.begin() + (t0 + 8) * 16).size();
  };
  EXPECT_LT(union_of_8(clustered, 100), 24u);
  EXPECT_GT(union_of_8(random, 100), 100u);
}

// The partial pattern's shared fraction sets how much neighbouring prefill
// tokens' selections overlap: the mean union over 8 consecutive tokens falls
// from random's towards clustered's as it grows, and at 1 the rows are the
// clustered pattern's.
TEST(BenchTopk, PartialPrefillOverlapFollowsTheSharedFraction) {
  const std::vector<std::int32_t> qlens{1024}, seq{32768 + 1024};
  const auto qs = starts(qlens);
  auto mean_union_of_8 = [](const std::vector<std::int32_t>& ids) {
    double sum = 0.0;
    for (int t0 = 0; t0 < 1024; t0 += 8)
      sum += double(std::set<std::int32_t>(ids.begin() + t0 * 16, ids.begin() + (t0 + 8) * 16).size());
    return sum / 128.0;
  };
  const double random = mean_union_of_8(make_bench_topk(qs, seq, 1, 16, true, TopkPattern::random, 9));
  const double clustered = mean_union_of_8(make_bench_topk(qs, seq, 1, 16, true, TopkPattern::clustered, 9));
  double before = random;
  for (const double shared : {0.0, 0.25, 0.5, 0.75, 0.875}) {
    SCOPED_TRACE(shared);
    const auto ids = make_bench_topk(qs, seq, 1, 16, true, TopkPattern::partial, 9, shared);
    expect_valid_rows(qs, seq, ids, 1, 16);
    const double u = mean_union_of_8(ids);
    if (shared == 0.0) {
      EXPECT_NEAR(u, random, 0.1 * random);
    }
    EXPECT_LE(u, before + 1.0) << "mean union " << u;
    before = u;
  }
  // 0.875: 13 of 15 ids from the set (2 x 8 uniform ones over 256 blocks).
  EXPECT_LT(before, random / 2.0);
  EXPECT_GT(before, clustered + 8.0);
  EXPECT_EQ(make_bench_topk(qs, seq, 1, 16, true, TopkPattern::partial, 9, 1.0),
            make_bench_topk(qs, seq, 1, 16, true, TopkPattern::clustered, 9));
  // Decode rows under partial are random ones.
  const std::vector<std::int32_t> dq{1, 1}, dseq{9000, 300};
  EXPECT_EQ(make_bench_topk(starts(dq), dseq, 2, 16, false, TopkPattern::partial, 4),
            make_bench_topk(starts(dq), dseq, 2, 16, false, TopkPattern::random, 4));
}

TEST(BenchTopk, PageMapGivesSelectedBlocksOwnPages) {
  const std::vector<std::int32_t> qlens{2, 1}, seq{1000, 300};
  const auto qs = starts(qlens);
  const auto ids = make_bench_topk(qs, seq, 2, 4, false, TopkPattern::random, 3);
  const PageMap m = map_pages(qs, seq, ids, 2, 4, false, 100);
  EXPECT_EQ(m.max_blocks, 8);
  std::set<std::int32_t> pages;
  std::int64_t selected = 0;
  for (std::size_t r = 0; r < 2; ++r) {
    std::set<std::int32_t> used;
    for (std::int64_t i = std::int64_t(qs[r]) * 8; i < std::int64_t(qs[r + 1]) * 8; ++i)
      if (ids[std::size_t(i)] >= 0) used.insert(ids[std::size_t(i)]);
    selected += std::int64_t(used.size());
    for (std::int32_t b = 0; b < m.max_blocks; ++b) {
      const std::int32_t page = m.table[r * 8 + std::size_t(b)];
      if (used.count(b)) {
        EXPECT_GT(page, 100);
        EXPECT_TRUE(pages.insert(page).second) << "page " << page << " mapped twice";
      } else {
        EXPECT_EQ(page, 100);
      }
    }
  }
  EXPECT_EQ(m.pages, 1 + selected);
  for (const auto p : pages) EXPECT_LT(p, 100 + m.pages);
  const PageMap all = map_pages(qs, seq, ids, 2, 4, true, 0);
  EXPECT_EQ(all.pages, 1 + 8 + 3);
}

// A prefill step of several requests, built as `msa bench` builds it: the
// accounting against a count over every (request, KV head, token, key), and
// the page map against the memory bound.
TEST(BenchAccounting, MultiRequestPrefillMatchesBruteForce) {
  BenchCase c = make_bench_case(BenchOp::attend, true, 6, 2, DType::bf16, 300, 3, 150);
  c.topk = 4;
  const int H = 2, group = 3, K = 4;
  const BatchMetadata m = build_metadata(bench_batch_spec(c));
  ASSERT_EQ(m.num_prefills, 3);
  ASSERT_EQ(m.num_decodes, 0);
  ASSERT_EQ(m.query_start, (std::vector<std::int32_t>{0, 150, 300, 450}));
  ASSERT_EQ(m.seq_lens, (std::vector<std::int32_t>{450, 450, 450}));
  for (const TopkPattern pattern : {TopkPattern::random, TopkPattern::clustered}) {
    for (const std::uint64_t seed : {21u, 22u}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " pattern " << int(pattern));
      const auto ids = make_bench_topk(m.query_start, m.seq_lens, H, K, true, pattern, seed);
      expect_valid_rows(m.query_start, m.seq_lens, ids, H, K);
      std::int64_t keys = 0;
      std::set<std::int64_t> blocks;  // r * 1000 + h * 100 + block
      for (std::int32_t t = 0; t < m.num_tokens; ++t) {
        const std::int32_t r = m.token_request[std::size_t(t)], p = m.token_position[std::size_t(t)];
        for (int h = 0; h < H; ++h) {
          const std::int32_t* row = ids.data() + (std::int64_t(t) * H + h) * K;
          for (std::int32_t j = 0; j <= p && j < m.seq_lens[std::size_t(r)]; ++j) {
            if (std::find(row, row + K, j / 128) == row + K) continue;
            keys += group;
            blocks.insert(r * 1000 + h * 100 + j / 128);
          }
        }
      }
      const Traffic t = attend_traffic(m.query_start, m.seq_lens, ids, H, group, K, 1000);
      EXPECT_EQ(t.keys, keys);
      EXPECT_DOUBLE_EQ(t.flops, 4.0 * 128 * double(keys));
      EXPECT_EQ(t.blocks, std::int64_t(blocks.size()));
      EXPECT_DOUBLE_EQ(t.bytes, 1000.0 * double(blocks.size()));
      const PageMap map = map_pages(m.query_start, m.seq_lens, ids, H, K, false, 0);
      const double used = double(map.pages) * H * double(kv_block_bytes(DType::bf16, ScaleMode::none)) +
                          4.0 * double(ids.size() + map.table.size());
      EXPECT_LE(used, bench_copy_bytes_bound(c));
    }
  }
  std::int64_t scored = 0;
  for (const std::int32_t p : m.token_position) scored += std::int64_t(p + 1) * H;
  const Traffic ix = index_traffic(m.query_start, m.seq_lens, H, DType::bf16, false);
  EXPECT_EQ(ix.keys, scored);
  EXPECT_EQ(ix.blocks, 3 * 4);
  c.op = BenchOp::index;
  const PageMap all = map_pages(m.query_start, m.seq_lens, {}, H, K, true, 0);
  EXPECT_LE(double(all.pages) * 128 * 128 * 2 + 4.0 * double(all.table.size()), bench_copy_bytes_bound(c));
}

TEST(BenchCases, DefaultSweepCoversAndFits) {
  const auto cases = default_bench_cases();
  std::set<std::string> names;
  std::set<std::int32_t> contexts, batches, qlens;
  std::set<int> kinds;
  int prefills = 0;
  for (const BenchCase& c : cases) {
    EXPECT_TRUE(names.insert(c.name()).second) << c.name();
    contexts.insert(c.context);
    batches.insert(c.batch);
    if (!c.prefill) qlens.insert(c.query_len);
    prefills += c.prefill;
    kinds.insert(int(c.op) * 100 + int(c.dtype));
    EXPECT_EQ(c.num_q_heads / c.num_kv_heads, 16);
    // Two copies of the inputs fit in 60 GB with room for the shared parts.
    EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9) << c.name();
  }
  EXPECT_EQ(cases.size(), 408u);  // 48 prefill (two chunk sizes) + 360 decode/verify (5 batches x 3 q)
  EXPECT_EQ(*contexts.begin(), 8192);
  EXPECT_EQ(*contexts.rbegin(), 131072);
  EXPECT_EQ(*batches.begin(), 1);
  EXPECT_EQ(*batches.rbegin(), 128);
  EXPECT_EQ(batches.count(64), 1u);
  EXPECT_EQ(qlens, (std::set<std::int32_t>{1, 2, 4}));
  EXPECT_GT(prefills, 0);
  EXPECT_EQ(kinds.size(), 4u);  // attend x {bf16, fp8, nvfp4}, index x bf16
  const auto quick = quick_bench_cases();
  EXPECT_GE(quick.size(), 8u);
  EXPECT_LE(quick.size(), 14u);
}

TEST(BenchCases, ProductionSetCoversAndFits) {
  const auto cases = bench_case_set("production");
  EXPECT_LE(cases.size(), 40u);
  std::set<std::string> names;
  std::set<std::int32_t> chunks, contexts, batches;
  std::set<int> shapes, kinds;
  for (const BenchCase& c : cases) {
    SCOPED_TRACE(c.name());
    EXPECT_TRUE(names.insert(c.name()).second);
    EXPECT_TRUE(c.prefill);
    EXPECT_EQ(c.topk, 16);
    chunks.insert(c.query_len);
    contexts.insert(c.context);
    batches.insert(c.batch);
    shapes.insert(c.num_q_heads * 100 + c.num_kv_heads);
    kinds.insert(int(c.op) * 100 + int(c.dtype));
    if (c.query_len > 2048) {
      EXPECT_LE(c.batch, 2);
    }
    EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9);
    const BatchMetadata m = build_metadata(bench_batch_spec(c));
    EXPECT_EQ(m.num_prefills, c.batch);
    EXPECT_EQ(m.num_prefill_tokens, c.num_tokens());
  }
  EXPECT_EQ(chunks, (std::set<std::int32_t>{256, 1536, 16384}));
  EXPECT_EQ(contexts, (std::set<std::int32_t>{17 * 1024, 64 * 1024, 170 * 1024}));
  EXPECT_EQ(*batches.begin(), 1);
  EXPECT_EQ(*batches.rbegin(), 10);
  EXPECT_EQ(shapes, (std::set<int>{1601, 6404}));
  EXPECT_EQ(kinds.size(), 3u);  // attend x {bf16, fp8_e4m3}, index x bf16
  EXPECT_TRUE(names.count("attend prefill 64/4 bf16 ctx=170K b=10 q=256"));
  EXPECT_TRUE(names.count("attend prefill 16/1 bf16 ctx=170K b=2 q=16384"));
  EXPECT_EQ(bench_case_set("default").size(), default_bench_cases().size());
  EXPECT_EQ(bench_case_set("quick").size(), quick_bench_cases().size());
  EXPECT_THROW(bench_case_set("fast"), Error);
}

TEST(BenchCases, FiltersMatchWholeWords) {
  BenchCase c;
  c.num_q_heads = 64;
  c.num_kv_heads = 4;
  c.batch = 128;
  c.query_len = 4;
  EXPECT_EQ(c.name(), "attend verify 64/4 bf16 ctx=8K b=128 q=4");
  EXPECT_TRUE(matches_any(c, {}));
  EXPECT_TRUE(matches_any(c, {"verify 64/4 b=128"}));
  EXPECT_FALSE(matches_any(c, {"b=1"}));
  EXPECT_TRUE(matches_any(c, {"index", "bf16 q=4"}));
  EXPECT_FALSE(matches_any(c, {"index", "prefill"}));
}

TEST(BenchRotation, CopiesSpanL2WithinMemory) {
  const double l2 = 50e6;
  EXPECT_EQ(rotation_copies(1e9, 1e9, l2, 40e9), 2);    // big: two copies
  EXPECT_EQ(rotation_copies(20e6, 20e6, l2, 40e9), 10);  // 4 x 50 MB / 20 MB
  EXPECT_EQ(rotation_copies(1e3, 1e3, l2, 40e9), 64);    // capped
  EXPECT_EQ(rotation_copies(1e9, 30e9, l2, 40e9), 1);    // memory wins
}

TEST(BenchTiming, Summary) {
  const TimeStats s = summarize_ms({0.003f, 0.001f, 0.002f, 0.010f});
  EXPECT_EQ(s.samples, 4);
  EXPECT_NEAR(s.median_us, 2.5, 1e-3);
  EXPECT_NEAR(s.min_us, 1.0, 1e-3);
  EXPECT_NEAR(s.mean_us, 4.0, 1e-3);
  EXPECT_NEAR(s.p90_us, 10.0, 1e-3);
  EXPECT_NEAR(summarize_ms({0.001f, 0.002f, 0.004f}).median_us, 2.0, 1e-3);
  EXPECT_EQ(summarize_ms({}).samples, 0);
}

TEST(BenchAccounting, IndexBytesPerDtype) {
  EXPECT_EQ(index_row_bytes(DType::bf16), 256);
  EXPECT_EQ(index_row_bytes(DType::fp8_e4m3), 128);
  EXPECT_EQ(index_row_bytes(DType::nvfp4), 72);
  const std::vector<std::int32_t> qs = starts({1, 3}), seq{129, 1000};
  EXPECT_DOUBLE_EQ(index_traffic(qs, seq, 4, DType::nvfp4, true).bytes, 10.0 * 9216);
  EXPECT_EQ(index_traffic(qs, seq, 4, DType::nvfp4, true).keys, index_traffic(qs, seq, 4, DType::bf16, true).keys);
}

TEST(BenchAccounting, InsertTrafficByHand) {
  // 3 tokens, 2 KV heads. Read: K and V 3 x 2 x 128 bf16 each, index keys 3 x
  // 128 bf16, two int64 slots per token.
  const double read = 2 * 3 * 2 * 128 * 2 + 3 * 128 * 2 + 3 * 2 * 8;
  Traffic t = insert_traffic(3, 2, DType::bf16, ScaleMode::none, DType::bf16);
  EXPECT_DOUBLE_EQ(t.bytes, read + 3 * 2 * 512 + 3 * 256);
  EXPECT_EQ(t.keys, 3);
  EXPECT_DOUBLE_EQ(t.flops, 0.0);
  t = insert_traffic(3, 2, DType::fp8_e4m3, ScaleMode::per_tensor, DType::fp8_e4m3);
  EXPECT_DOUBLE_EQ(t.bytes, read + 3 * 2 * 256 + 3 * 128);
  t = insert_traffic(3, 2, DType::fp8_e4m3, ScaleMode::per_token_head, DType::bf16);
  EXPECT_DOUBLE_EQ(t.bytes, read + 3 * 2 * (256 + 8) + 3 * 256);
  t = insert_traffic(3, 2, DType::nvfp4, ScaleMode::per_tensor, DType::nvfp4);
  EXPECT_DOUBLE_EQ(t.bytes, read + 3 * 2 * 144 + 3 * 72);
}

TEST(BenchAccounting, StageSharesAndSums) {
  const std::vector<double> s = stage_shares({1.0, 3.0, 4.0});
  EXPECT_DOUBLE_EQ(s[0], 0.125);
  EXPECT_DOUBLE_EQ(s[1], 0.375);
  EXPECT_DOUBLE_EQ(s[2], 0.5);
  EXPECT_EQ(stage_shares({0.0, 0.0}), (std::vector<double>{0.0, 0.0}));
  const Traffic t = Traffic{.flops = 1.0, .fp8_flops = 0.5, .bytes = 2.0, .keys = 3, .blocks = 4} +
                    Traffic{.flops = 10.0, .fp8_flops = 5.0, .bytes = 20.0, .keys = 30, .blocks = 40};
  EXPECT_DOUBLE_EQ(t.flops, 11.0);
  EXPECT_DOUBLE_EQ(t.fp8_flops, 5.5);
  EXPECT_DOUBLE_EQ(t.bytes, 22.0);
  EXPECT_EQ(t.keys, 33);
  EXPECT_EQ(t.blocks, 44);
}

TEST(BenchCases, LayerAndPatternNames) {
  BenchCase c = make_bench_case(BenchOp::layer, false, 64, 4, DType::fp8_e4m3, 131072, 128, 4);
  c.index_dtype = DType::nvfp4;
  EXPECT_EQ(c.name(), "layer verify 64/4 fp8_e4m3 index=nvfp4 ctx=128K b=128 q=4");
  EXPECT_TRUE(matches_any(c, {"layer index=nvfp4"}));
  EXPECT_FALSE(matches_any(c, {"layer index=bf16"}));
  BenchCase a = make_bench_case(BenchOp::attend, true, 16, 1, DType::bf16, 32768, 1, 4096);
  EXPECT_EQ(a.name(), "attend prefill 16/1 bf16 ctx=32K b=1 q=4096");
  a.pattern = TopkPattern::partial;
  a.shared = 0.7;
  EXPECT_EQ(a.name(), "attend prefill 16/1 bf16 ctx=32K b=1 q=4096 partial=0.70");
  EXPECT_TRUE(matches_any(a, {"q=4096 partial=0.70"}));
  a.pattern = TopkPattern::clustered;
  EXPECT_EQ(a.name(), "attend prefill 16/1 bf16 ctx=32K b=1 q=4096 clustered");
  // The case's own pattern, else the run's, else random (attend) / clustered (layer).
  EXPECT_EQ(case_pattern(a, TopkPattern::random), TopkPattern::clustered);
  a.pattern.reset();
  EXPECT_EQ(case_pattern(a, std::nullopt), TopkPattern::random);
  EXPECT_EQ(case_pattern(a, TopkPattern::clustered), TopkPattern::clustered);
  EXPECT_EQ(case_pattern(c, std::nullopt), TopkPattern::clustered);
  EXPECT_EQ(case_pattern(c, TopkPattern::random), TopkPattern::random);
  EXPECT_EQ(index_query_dtype(DType::fp8_e4m3), DType::fp8_e4m3);
  EXPECT_EQ(index_query_dtype(DType::bf16), DType::bf16);
  EXPECT_EQ(index_query_dtype(DType::nvfp4), DType::bf16);
}

TEST(BenchCases, LayerSetCoversAndFits) {
  const auto cases = bench_case_set("layer");
  std::set<std::string> names;
  std::map<DType, int> by_index;
  std::set<std::int32_t> batches, qlens, contexts;
  std::set<int> shapes;
  int prefills = 0, fp8_kv = 0;
  for (const BenchCase& c : cases) {
    SCOPED_TRACE(c.name());
    EXPECT_EQ(c.op, BenchOp::layer);
    EXPECT_TRUE(names.insert(c.name()).second);
    EXPECT_FALSE(c.pattern.has_value());
    ++by_index[c.index_dtype];
    shapes.insert(c.num_q_heads * 100 + c.num_kv_heads);
    if (c.prefill) {
      ++prefills;
    } else {
      batches.insert(c.batch);
      qlens.insert(c.query_len);
      contexts.insert(c.context);
    }
    fp8_kv += c.dtype == DType::fp8_e4m3;
    EXPECT_TRUE(c.dtype == DType::bf16 || c.dtype == DType::fp8_e4m3);
    // Two copies and the shared inputs fit the bench's 40 GB.
    EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9);
  }
  EXPECT_EQ(cases.size(), 134u);
  EXPECT_EQ(by_index[DType::bf16], 60 + 6 + 4);
  EXPECT_EQ(by_index[DType::fp8_e4m3], 24 + 6);
  EXPECT_EQ(by_index[DType::nvfp4], 24 + 6 + 4);
  EXPECT_EQ(prefills, 18 + 4);
  EXPECT_EQ(fp8_kv, 8);
  EXPECT_EQ(batches, (std::set<std::int32_t>{1, 8, 32, 64, 128}));
  EXPECT_EQ(qlens, (std::set<std::int32_t>{1, 2, 4}));
  EXPECT_EQ(contexts, (std::set<std::int32_t>{32768, 131072}));
  EXPECT_EQ(shapes, (std::set<int>{1601, 6404}));
  for (const char* n : {"layer decode 16/1 bf16 index=bf16 ctx=128K b=128 q=1",
                        "layer decode 64/4 bf16 index=nvfp4 ctx=128K b=128 q=1",
                        "layer decode 64/4 bf16 index=fp8_e4m3 ctx=32K b=8 q=1",
                        "layer verify 16/1 bf16 index=bf16 ctx=32K b=1 q=2",
                        "layer prefill 16/1 bf16 index=bf16 ctx=170K b=1 q=16384",
                        "layer prefill 64/4 bf16 index=nvfp4 ctx=64K b=10 q=256",
                        "layer prefill 64/4 fp8_e4m3 index=nvfp4 ctx=170K b=1 q=16384"})
    EXPECT_TRUE(names.count(n)) << n;
  const auto quick = bench_case_set("layer", true);
  EXPECT_GE(quick.size(), 8u);
  EXPECT_LE(quick.size(), 16u);
  for (const BenchCase& c : quick) EXPECT_EQ(c.op, BenchOp::layer);
  EXPECT_EQ(bench_case_set("default", true).size(), quick_bench_cases().size());
  EXPECT_THROW(bench_case_set("production", true), Error);
  EXPECT_THROW(bench_case_set("peers", true), Error);
}

TEST(BenchCases, IndexSetCoversTheIndexDtypes) {
  std::set<DType> dtypes, prefill_dtypes;
  for (const BenchCase& c : bench_case_set("index")) {
    SCOPED_TRACE(c.name());
    EXPECT_EQ(c.op, BenchOp::index);
    dtypes.insert(c.dtype);
    if (c.prefill) prefill_dtypes.insert(c.dtype);
    EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9);
  }
  EXPECT_EQ(dtypes, (std::set<DType>{DType::bf16, DType::fp8_e4m3, DType::nvfp4}));
  EXPECT_EQ(prefill_dtypes, dtypes);
}

TEST(BenchCases, PeersSetIsTheComparisonTables) {
  const auto cases = bench_case_set("peers");
  EXPECT_EQ(cases.size(), 3u * 42u);
  std::set<std::string> names;
  std::map<DType, int> by_kv;
  for (const BenchCase& c : cases) {
    SCOPED_TRACE(c.name());
    EXPECT_EQ(c.op, BenchOp::attend);
    EXPECT_TRUE(names.insert(c.name()).second);
    ++by_kv[c.dtype];
    EXPECT_EQ(c.pattern.has_value(), c.prefill);
    EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9);
  }
  EXPECT_EQ(by_kv, (std::map<DType, int>{{DType::bf16, 42}, {DType::fp8_e4m3, 42}, {DType::nvfp4, 42}}));
  for (const char* kv : {"fp8_e4m3", "bf16", "nvfp4"}) {
    const std::string k = kv;
    for (const char* pattern : {"random", "clustered"}) {
      const std::string p = pattern;
      for (const std::string& n :
           {"attend prefill 16/1 " + k + " ctx=32K b=1 q=4096 " + p, "attend prefill 64/4 " + k + " ctx=32K b=1 q=4096 " + p,
            "attend prefill 16/1 " + k + " ctx=128K b=1 q=4096 " + p, "attend prefill 16/1 " + k + " ctx=32K b=1 q=32768 " + p})
        EXPECT_TRUE(names.count(n)) << n;
    }
    for (const std::string& n :
         {"attend prefill 16/1 " + k + " ctx=64K b=10 q=256 clustered", "attend prefill 64/4 " + k + " ctx=64K b=4 q=1536 clustered",
          "attend prefill 64/4 " + k + " ctx=170K b=1 q=16384 clustered", "attend decode 16/1 " + k + " ctx=32K b=1 q=1",
          "attend decode 64/4 " + k + " ctx=128K b=128 q=1", "attend decode 16/1 " + k + " ctx=128K b=64 q=1",
          "attend verify 16/1 " + k + " ctx=32K b=32 q=4", "attend verify 64/4 " + k + " ctx=128K b=128 q=4"})
      EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_TRUE(matches_any(cases.front(), {"fp8_e4m3 random"}));
}

TEST(BenchCases, OverlapSetSweepsTheSharedFraction) {
  const auto cases = bench_case_set("overlap");
  EXPECT_EQ(cases.size(), 2u * 3u * 8u);
  std::set<std::string> names;
  for (const BenchCase& c : cases) {
    SCOPED_TRACE(c.name());
    EXPECT_EQ(c.op, BenchOp::attend);
    EXPECT_TRUE(c.prefill);
    ASSERT_TRUE(c.pattern.has_value());
    EXPECT_TRUE(names.insert(c.name()).second);
    EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9);
  }
  for (const char* kv : {"bf16", "fp8_e4m3"}) {
    const std::string k = kv;
    for (const char* p : {"random", "partial=0.20", "partial=0.40", "partial=0.60", "partial=0.70", "partial=0.80",
                          "partial=0.90", "clustered"})
      for (const std::string& n : {"attend prefill 16/1 " + k + " ctx=32K b=1 q=4096 " + p,
                                   "attend prefill 64/4 " + k + " ctx=32K b=1 q=4096 " + p,
                                   "attend prefill 16/1 " + k + " ctx=32K b=1 q=32768 " + p})
        EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_THROW(bench_case_set("overlap", true), Error);
}

TEST(BenchCases, RanksSetCoversTp2AndTp8) {
  const auto cases = bench_case_set("ranks");
  EXPECT_EQ(cases.size(), 2u * (3u * 9u + 3u + 9u));
  std::set<std::string> names;
  std::map<BenchOp, int> by_op;
  for (const BenchCase& c : cases) {
    SCOPED_TRACE(c.name());
    EXPECT_TRUE(names.insert(c.name()).second);
    EXPECT_TRUE((c.num_q_heads == 32 && c.num_kv_heads == 2) || (c.num_q_heads == 8 && c.num_kv_heads == 1));
    ++by_op[c.op];
    if (c.op == BenchOp::attend) {
      EXPECT_EQ(c.pattern.has_value(), c.prefill);
      EXPECT_LT(2 * bench_copy_bytes_bound(c) + bench_shared_bytes(c), 40e9);
    }
  }
  EXPECT_EQ(by_op, (std::map<BenchOp, int>{{BenchOp::attend, 54}, {BenchOp::index, 6}, {BenchOp::pre_attention, 18}}));
  for (const char* shape : {"32/2", "8/1"}) {
    const std::string h = shape;
    for (const char* kv : {"bf16", "fp8_e4m3", "nvfp4"}) {
      const std::string k = kv;
      const std::string hk = h + " " + k;
      for (const std::string& n :
           {"attend prefill " + hk + " ctx=64K b=10 q=256 clustered",
            "attend prefill " + hk + " ctx=170K b=1 q=16384 clustered",
            "attend prefill " + hk + " ctx=32K b=1 q=4096 random", "attend decode " + hk + " ctx=32K b=1 q=1",
            "attend decode " + hk + " ctx=32K b=128 q=1", "attend verify " + hk + " ctx=32K b=32 q=4"})
        EXPECT_TRUE(names.count(n)) << n;
    }
  }
}

// The device's choice counted on the host: by hand on a small plan, then on
// the overlap set's two ends.
TEST(BenchChoice, CountsByHandAndAtTheEnds) {
  K2QPlan plan;
  plan.offsets = {0, 3, 3, 6};
  plan.tokens = {0, 1, 9, 3, 20, 21};
  // Tiles of 8 tokens: edges 0, 9 (tile 1), 3 (tile 0 after tile 1) and 20 (tile 2) start rounds.
  PrefillChoice c = count_prefill_choice(plan, 8, 4);
  EXPECT_EQ(c.tile_rounds, 4);
  EXPECT_EQ(c.items, 2);  // ceil(3 / 4) + 0 + ceil(3 / 4)
  EXPECT_TRUE(c.key_major);
  c = count_prefill_choice(plan, 32, 2);
  EXPECT_EQ(c.tile_rounds, 1);
  EXPECT_EQ(c.items, 4);
  EXPECT_FALSE(c.key_major);

  BenchCase a = make_bench_case(BenchOp::attend, true, 16, 1, DType::bf16, 32768, 1, 4096);
  a.pattern = TopkPattern::random;
  const PrefillChoice random = prefill_choice(a, 1, std::nullopt);
  EXPECT_TRUE(random.key_major);
  EXPECT_FALSE(random.planned);  // 4096 tokens: automatic runs the token tiles without the plan
  EXPECT_TRUE(prefill_choice(a, 1, std::nullopt, 4096).planned);
  // 16 edges a token, 4 tokens an item: at least 4096 x 16 / 4 items; random
  // tiles of 8 tokens reach about 100 blocks each.
  EXPECT_GE(random.items, 4096 * 16 / 4);
  EXPECT_GT(random.tile_rounds, 3 * random.items);
  a.pattern = TopkPattern::clustered;
  const PrefillChoice clustered = prefill_choice(a, 1, std::nullopt);
  EXPECT_FALSE(clustered.key_major);
  EXPECT_LT(clustered.tile_rounds, random.tile_rounds / 4);
  // The run's pattern applies where the case has none.
  a.pattern.reset();
  EXPECT_EQ(prefill_choice(a, 1, TopkPattern::clustered).tile_rounds, clustered.tile_rounds);
}

TEST(BenchTopk, StepSlotsFollowTheMap) {
  // Two requests: 2 new tokens at positions 254, 255 (block 1), 1 new token at
  // position 128 (block 1), and a padding request.
  const std::vector<std::int32_t> qs = starts({2, 1, 1}), seq{256, 129, 0};
  const PageMap m = map_pages(qs, seq, {}, 1, 16, true, 10);
  ASSERT_EQ(m.max_blocks, 2);
  const std::vector<std::int64_t> slots = step_slots(qs, seq, m);
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[0], std::int64_t(m.table[1]) * 128 + 126);
  EXPECT_EQ(slots[1], std::int64_t(m.table[1]) * 128 + 127);
  EXPECT_EQ(slots[2], std::int64_t(m.table[3]) * 128 + 0);
  EXPECT_EQ(slots[3], -1);
}

TEST(BenchDirected, GroupsOfPagesAndTokens) {
  const std::vector<std::int32_t> qs = starts({1, 2}), seq{1000, 600};  // 8 and 5 blocks
  const std::int64_t per = groups_per_request(seq);
  EXPECT_EQ(per, 2);
  const PageMap m = map_pages(qs, seq, {}, 1, 16, true, 7);
  const std::vector<std::int64_t> g = page_groups(m, 7, per);
  ASSERT_EQ(std::int64_t(g.size()), m.pages);
  EXPECT_EQ(g[0], -1);  // the shared page
  for (std::int32_t r = 0; r < 2; ++r) {
    for (std::int32_t b = 0; b < (seq[std::size_t(r)] + 127) / 128; ++b) {
      const std::int32_t page = m.table[std::size_t(r * m.max_blocks + b)];
      EXPECT_EQ(g[std::size_t(page - 7)], r * per + b / 4) << r << " " << b;
    }
  }
  // Positions 999 (block 7), 598 and 599 (block 4).
  EXPECT_EQ(token_groups(qs, seq, per), (std::vector<std::int64_t>{1, per + 1, per + 1}));
}

TEST(BenchDirected, QueryGroupsShareAndDrift) {
  const std::vector<std::int32_t> dq = starts({4, 4}), dseq{131072 + 4, 8192 + 4};
  const std::int64_t per = groups_per_request(dseq);
  EXPECT_TRUE(std::all_of(query_groups(dq, dseq, 2, false, TopkPattern::random, per, 1).begin(),
                          query_groups(dq, dseq, 2, false, TopkPattern::random, per, 1).end(),
                          [](std::int64_t x) { return x == -1; }));
  const auto g = query_groups(dq, dseq, 2, false, TopkPattern::clustered, per, 1);
  ASSERT_EQ(g.size(), 8u * 2 * kQueryGroups);
  EXPECT_EQ(g, query_groups(dq, dseq, 2, false, TopkPattern::clustered, per, 1));
  for (std::int32_t t = 0; t < 8; ++t) {
    const std::int32_t r = t < 4 ? 0 : 1;
    const std::int64_t eligible = (dseq[std::size_t(r)] - 4) / 128 / kRunBlocks;
    for (int h = 0; h < 2; ++h) {
      const std::int64_t* row = g.data() + (t * 2 + h) * kQueryGroups;
      std::set<std::int64_t> distinct(row, row + kQueryGroups);
      EXPECT_EQ(distinct.size(), std::size_t(kQueryGroups));
      for (int k = 0; k < kQueryGroups; ++k) {
        EXPECT_GE(row[k], r * per);
        EXPECT_LT(row[k], r * per + eligible);
      }
    }
  }
  // The verify rows of a request share most of their groups.
  std::set<std::int64_t> request0;
  for (std::int32_t t = 0; t < 4; ++t) request0.insert(g.begin() + t * 2 * kQueryGroups, g.begin() + t * 2 * kQueryGroups + kQueryGroups);
  EXPECT_LT(request0.size(), 12u);
  // Prefill: neighbouring tokens share their set; the set drifts over the chunk.
  const std::vector<std::int32_t> pq = starts({512}), pseq{32768 + 512};
  const auto p = query_groups(pq, pseq, 1, true, TopkPattern::clustered, groups_per_request(pseq), 3);
  int changes = 0;
  for (std::int32_t t = 1; t < 512; ++t)
    changes += !std::equal(p.begin() + t * kQueryGroups, p.begin() + (t + 1) * kQueryGroups, p.begin() + (t - 1) * kQueryGroups);
  EXPECT_GT(changes, 20);
  EXPECT_LT(changes, 120);
  for (std::int32_t t = 0; t < 512; ++t)
    for (int k = 0; k < kQueryGroups; ++k) EXPECT_LE(p[std::size_t(t * kQueryGroups + k)], (32768 + t) / 128 / kRunBlocks);
}

TEST(BenchDirected, SelectionFractionByHand) {
  // One decode request at position 1024 (block 8), one KV head, top-k 5, its
  // groups {0, 1} (blocks 0-7).
  const std::vector<std::int32_t> qs = starts({1}), seq{1025};
  const std::int64_t per = groups_per_request(seq);
  std::vector<std::int64_t> groups{0, 1, -1, -1};
  const std::vector<std::int32_t> topk{1, 2, 6, 7, 8};
  EXPECT_DOUBLE_EQ(group_selection_fraction(qs, seq, {1, 2, 5, 8, -1}, 1, 5, groups, per), 1.0);
  EXPECT_DOUBLE_EQ(group_selection_fraction(qs, seq, topk, 1, 5, groups, per), 1.0);
  groups = {0, -1, -1, -1};
  EXPECT_DOUBLE_EQ(group_selection_fraction(qs, seq, topk, 1, 5, groups, per), 0.5);
  EXPECT_DOUBLE_EQ(group_selection_fraction(qs, seq, topk, 1, 5, {-1, -1, -1, -1}, per), -1.0);
}

TEST(BenchAccounting, LayerCopyBoundCoversItsMaps) {
  // A layer step of 3 prefill requests: the index map of every block, a KV map
  // of selected blocks and the tables fit the bound of one copy.
  BenchCase c = make_bench_case(BenchOp::layer, true, 8, 2, DType::bf16, 1000, 3, 300);
  c.index_dtype = DType::nvfp4;
  const BatchMetadata m = build_metadata(bench_batch_spec(c));
  const auto ids = make_bench_topk(m.query_start, m.seq_lens, 2, 16, true, TopkPattern::random, 5);
  const PageMap index = map_pages(m.query_start, m.seq_lens, {}, 2, 16, true, 0);
  const PageMap kv = map_pages(m.query_start, m.seq_lens, ids, 2, 16, false, 0);
  const double used = double(index.pages) * 9216 + double(kv.pages) * 2 * 65536 +
                      4.0 * double(ids.size() + index.table.size() + kv.table.size()) + 16.0 * double(m.num_tokens);
  EXPECT_LE(used, bench_copy_bytes_bound(c));
  EXPECT_GT(bench_shared_bytes(c), 0.0);
}

TEST(CheckCases, CoverEveryDimension) {
  const std::uint64_t seed = 1234;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto cases = make_check_cases(seed, 84, false);
  std::set<std::string> flavors, layouts;
  std::set<int> groups, topks, kinds;
  std::set<DType> qs, index_dtypes;
  std::set<std::int32_t> seqs;
  int fp8_index_queries = 0;
  for (const CheckCase& c : cases) {
    SCOPED_TRACE(c.name());
    flavors.insert(kv_flavor_name(c.kv_dtype, c.scale_mode));
    layouts.insert(std::string(layout_name(c.layout)) + (c.padded_stride ? "+pad" : ""));
    groups.insert(c.group);
    topks.insert(c.topk);
    kinds.insert(int(c.kind));
    qs.insert(c.q_dtype);
    index_dtypes.insert(c.index_dtype);
    fp8_index_queries += c.fp8_index_query;
    if (c.fp8_index_query) {
      EXPECT_EQ(c.index_dtype, DType::fp8_e4m3);
      EXPECT_EQ(c.iq_dtype(), DType::fp8_e4m3);
    } else {
      EXPECT_EQ(c.iq_dtype(), c.src_dtype);
    }
    for (const auto s : c.seq_lens) seqs.insert(s);
    // The batch is one the metadata accepts, with at least one real request.
    BatchSpec spec{c.query_lens, c.seq_lens, c.decode_threshold};
    EXPECT_NO_THROW(build_metadata(spec));
    EXPECT_TRUE(std::any_of(c.seq_lens.begin(), c.seq_lens.end(), [](auto s) { return s > 0; }));
    EXPECT_TRUE(reference_work(c) <= 3e7 || c.query_lens.size() == 1) << reference_work(c);
    EXPECT_TRUE(is_half(c.out_dtype));
    if (is_half(c.q_dtype)) {
      EXPECT_EQ(c.q_dtype, c.out_dtype);
    }
  }
  EXPECT_EQ(flavors.size(), 7u);
  EXPECT_EQ(layouts.size(), 6u);
  EXPECT_EQ(groups, (std::set<int>{1, 2, 8, 16}));
  EXPECT_EQ(topks, (std::set<int>{1, 16, 64}));
  EXPECT_EQ(kinds.size(), 4u);
  EXPECT_TRUE(qs.count(DType::fp8_e4m3));
  EXPECT_EQ(index_dtypes, (std::set<DType>{DType::bf16, DType::fp8_e4m3, DType::nvfp4}));
  EXPECT_GE(fp8_index_queries, 84 / 3 / 4) << "about half of the fp8 index cases";
  for (const std::int32_t s : {1, 127, 129, 2047, 2049}) EXPECT_TRUE(seqs.count(s)) << "seq_len " << s;
  EXPECT_GE(*seqs.rbegin(), 10000);
}

TEST(CheckCases, DeterministicPerSeedAndQuickIsSmall) {
  const auto a = make_check_cases(7, 20, false), b = make_check_cases(7, 20, false);
  const auto c = make_check_cases(8, 20, false);
  bool any_differs = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name(), b[i].name());
    any_differs = any_differs || a[i].name() != c[i].name();
  }
  EXPECT_TRUE(any_differs);
  // Case i is the same whatever the count (replayable with --case).
  EXPECT_EQ(make_check_cases(7, 5, false)[4].name(), a[4].name());
  for (const CheckCase& q : make_check_cases(7, 14, true)) {
    EXPECT_LE(q.num_kv_heads, 2) << q.name();
    EXPECT_TRUE(reference_work(q) <= 4e6 || q.query_lens.size() == 1) << q.name();
  }
}

TEST(CheckCases, QuickListReachesKeyMajor) {
  // The last of the 14 quick cases is a prefill-only step on a 16-bit cache
  // whose tiles are 128 rows (G 16, top-k 16: 8 tokens), planned key-major.
  for (const std::uint64_t seed : {1ull, 7ull, 1234ull}) {
    const auto cases = make_check_cases(seed, 14, true);
    const CheckCase& c = cases.back();
    SCOPED_TRACE(c.name());
    EXPECT_TRUE(c.key_major);
    EXPECT_EQ(c.kind, BatchKind::prefill);
    EXPECT_TRUE(is_half(c.kv_dtype));
    EXPECT_EQ(c.group * 8, 128);
    EXPECT_EQ(c.topk, 16);
    EXPECT_EQ(c.q_dtype, c.kv_dtype);
    EXPECT_EQ(c.decode_threshold, 0);
    BatchSpec spec{c.query_lens, c.seq_lens, c.decode_threshold};
    EXPECT_NO_THROW(build_metadata(spec));
  }
}

TEST(CheckCompare, RelFrobenius) {
  EXPECT_EQ(rel_frobenius({1, 2, 3}, {1, 2, 3}).error, 0.0);
  const Diff d = rel_frobenius({1, 2, 3.5f}, {1, 2, 3});
  EXPECT_NEAR(d.error, 0.5 / std::sqrt(14.0), 1e-12);
  EXPECT_EQ(d.worst, 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(rel_frobenius({1, nan}, {1, 0}).error, kInf);
  EXPECT_EQ(rel_frobenius({0, 0}, {0, 0}).error, 0.0);
  EXPECT_EQ(rel_frobenius({1, 2}, {1, 2, 3}).error, kInf);
  EXPECT_EQ(rel_frobenius({-inf}, {-inf}).error, 0.0);
}

TEST(CheckCompare, RelFrobeniusRows) {
  // A small row 10% off beside a large exact one: hidden over the whole array.
  const std::vector<float> want = {100, 0, 0.5f, 0}, got = {100, 0, 0.55f, 0};
  EXPECT_LT(rel_frobenius(got, want).error, 1e-3);
  const Diff d = rel_frobenius_rows(got, want, 2);
  EXPECT_NEAR(d.error, 0.1, 1e-6);
  EXPECT_EQ(d.worst, 2);
  EXPECT_EQ(d.count, 1);
  EXPECT_EQ(rel_frobenius_rows(want, want, 2).error, 0.0);
  EXPECT_EQ(rel_frobenius_rows(got, want, 3).error, kInf);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(rel_frobenius_rows({1, nan}, {1, 1}, 1).error, kInf);
}

TEST(CheckCompare, MaxAbsAndScores) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(max_abs({-inf, 1.0f}, {-inf, 1.0f}).error, 0.0);
  EXPECT_EQ(max_abs({0.0f, 1.0f}, {-inf, 1.0f}).error, kInf);
  EXPECT_NEAR(max_abs({1.0f, 2.5f}, {1.0f, 2.0f}).error, 0.5, 1e-12);
  EXPECT_EQ(max_abs({nan}, {1.0f}).error, kInf);
  EXPECT_NEAR(score_error({10.5f, -inf}, {10.0f, -inf}).error, 0.5 / 11.0, 1e-9);
  EXPECT_EQ(score_error({1.0f}, {-inf}).error, kInf);
  const std::vector<std::uint8_t> x{1, 2, 3, 4}, y{1, 9, 3, 8};
  const Diff b = byte_mismatch(x.data(), y.data(), 4);
  EXPECT_EQ(b.error, 2.0);
  EXPECT_EQ(b.worst, 1);
}

}  // namespace
