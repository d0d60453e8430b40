// Options::check = false is safe: out-of-range top-k ids, block-table pages
// and slots are skipped, never dereferenced, and the result is what the
// checked engine gives on the same input with the bad entries removed. Bad
// views are refused in both modes. These are also the reproducers of crashes
// once found with AddressSanitizer (scripts/sanitize.sh runs this file under
// ASan and UBSan): an unchecked index over pages outside the pool, an attend
// over a cache view with negative or overlapping strides, a top-k view with a
// negative token stride.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/k2q.hpp"
#include "msa/key_major.hpp"
#include "workload.hpp"

namespace {

using msa::DType;
using msa::Workload;
using msa::WorkloadSpec;
using msa::test::expect_error;

constexpr msa::cpu::Options kChecked{2, true};
constexpr msa::cpu::Options kUnchecked{2, false};

// Two decodes of two tokens and a prefill of 40 tokens, 2 KV heads (TP2).
WorkloadSpec small_spec(DType kv = DType::bf16) {
  WorkloadSpec s;
  s.model = msa::ModelConfig::minimax_m3(2);
  s.model.topk = 4;
  s.kv_dtype = kv;
  s.requests = {{2, 300}, {2, 700}, {40, 600}};
  s.decode_threshold = 2;
  s.seed = 77;
  s.num_threads = 2;
  return s;
}

// The workload after insert and a checked index: valid top-k lists.
Workload ready(DType kv = DType::bf16) {
  Workload w(small_spec(kv));
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), kChecked);
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), kChecked);
  msa::cpu::index(w.step(), w.indexer_args(), kChecked);
  return w;
}

// ---- index -------------------------------------------------------------------------

TEST(Unchecked, IndexSkipsPagesOutsideThePool) {
  Workload w = ready();
  // Request 2's blocks 1 and 3 on pages outside the index cache, block 4 negative.
  const std::int64_t row = 2 * w.table_stride;
  w.index_block_table[row + 1] = std::int32_t(w.index_num_pages + 1000000);
  w.index_block_table[row + 3] = std::numeric_limits<std::int32_t>::max();
  w.index_block_table[row + 4] = -5;
  expect_error([&] { msa::cpu::index(w.step(), w.indexer_args(), kChecked); },
               {"block_table[r=2, b=1] = ", "but the cache has"});
  w.poison_outputs();
  msa::cpu::index(w.step(), w.indexer_args(), kUnchecked);
  // Every row is still a valid selection: ids in [0, p / 128], ascending, then -1.
  const auto& meta = w.meta();
  for (std::int32_t t = 0; t < meta.num_tokens; ++t) {
    for (int h = 0; h < w.model().num_kv_heads; ++h) {
      const std::int32_t* ids = w.topk.data() + (std::size_t(t) * w.model().num_kv_heads + h) * w.model().topk;
      const std::int32_t last = meta.token_position[t] / 128;
      for (int k = 0; k < w.model().topk; ++k) {
        if (k <= last) {
          EXPECT_GE(ids[k], 0);
          EXPECT_LE(ids[k], last);
          if (k > 0) {
            EXPECT_GT(ids[k], ids[k - 1]);
          }
        } else {
          EXPECT_EQ(ids[k], -1);
        }
      }
    }
  }
  // The block scores of the skipped blocks are NaN (no keys), the others finite.
  const std::int32_t max_blocks = w.max_blocks;
  std::vector<float> scores(std::size_t(meta.num_tokens) * w.model().num_kv_heads * max_blocks);
  msa::cpu::block_scores(w.step(), w.indexer_args(), scores.data(), max_blocks, kUnchecked);
  const std::int32_t t = meta.num_tokens - 1;  // the prefill's last token sees blocks 0..4
  for (std::int32_t b = 0; b <= meta.token_position[t] / 128; ++b) {
    const float s = scores[(std::size_t(t) * w.model().num_kv_heads) * max_blocks + b];
    if (b == 1 || b == 3 || b == 4) EXPECT_TRUE(std::isnan(s)) << "block " << b;
    else EXPECT_TRUE(std::isfinite(s)) << "block " << b;
  }
}

TEST(Unchecked, IndexWithATableNarrowerThanTheRequests) {
  Workload w = ready();
  msa::IndexerArgs a = w.indexer_args();
  a.block_table.max_blocks = 2;  // request 0 has 3 blocks, request 1 has 6
  expect_error([&] { msa::cpu::index(w.step(), a, kChecked); }, {"needs 3 blocks but the table has 2 columns"});
  EXPECT_NO_THROW(msa::cpu::index(w.step(), a, kUnchecked));
}

TEST(Unchecked, BadViewsAreRefusedInBothModes) {
  Workload w = ready();
  for (const msa::cpu::Options& opt : {kChecked, kUnchecked}) {
    // The reproducers: page_stride -1, token_stride -128 (reads before
    // the cache), page_stride 100, token_stride 64 (overlapping rows).
    const auto bad_cache = [&](auto edit, const char* word) {
      msa::AttentionArgs a = w.attention_args();
      edit(a.cache);
      expect_error([&] { msa::cpu::attend(w.step(), a, opt); }, word);
      expect_error([&] { msa::cpu::insert_kv(a.cache, w.insert_kv_args(), opt); }, word);
    };
    bad_cache([](msa::KVCacheView& c) { c.page_stride = -1; }, "cache.page_stride = -1");
    bad_cache([](msa::KVCacheView& c) { c.token_stride = -128; }, "cache.token_stride = -128");
    bad_cache([](msa::KVCacheView& c) { c.page_stride = 100; }, "cache.page_stride = 100");
    bad_cache([](msa::KVCacheView& c) { c.token_stride = 64; }, "cache.token_stride = 64");
    // A negative top-k token stride: read before the buffer by attend, written
    // before it by the indexer.
    msa::AttentionArgs a = w.attention_args();
    a.topk.token_stride = -a.topk.token_stride;
    expect_error([&] { msa::cpu::attend(w.step(), a, opt); }, "topk.token_stride = -8 is negative");
    msa::IndexerArgs ia = w.indexer_args();
    ia.out.token_stride = -8;
    expect_error([&] { msa::cpu::index(w.step(), ia, opt); }, "indexer: out.token_stride = -8 is negative");
    expect_error([&] { msa::build_k2q(w.step(), a.topk, 2); }, "topk.token_stride = -8 is negative");
  }
}

// ---- attend ------------------------------------------------------------------------

// Runs attend on the workload's current top-k, unchecked; returns the output bytes.
std::vector<std::uint8_t> attend_unchecked(Workload& w) {
  std::fill(w.out.begin(), w.out.end(), std::uint8_t(0x55));
  msa::cpu::attend(w.step(), w.attention_args(), kUnchecked);
  return w.out;
}

TEST(Unchecked, AttendSkipsBadIdsAndPages) {
  for (DType kv : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
    SCOPED_TRACE(msa::dtype_name(kv));
    Workload w = ready(kv);
    const std::vector<std::int32_t> good = w.topk;
    const int K = w.model().topk, H = w.model().num_kv_heads;
    // The reference: the checked engine on the lists with the bad entries left out.
    std::vector<std::int32_t> cleaned = good;
    // Token 0 (request 0, position 300: blocks 0..2), head 0: ids past the
    // table, past the position, negative, and a repeat.
    std::int32_t* row = w.topk.data();
    row[0] = 1000000;
    row[1] = 2;
    row[2] = 2;
    row[3] = -77;
    std::int32_t* clean = cleaned.data();
    clean[0] = 2, clean[1] = clean[2] = clean[3] = -1;
    // Token 1, head 1: a block past the token's position (301 sees blocks 0..2).
    w.topk[(1 * H + 1) * K + 0] = 3;
    cleaned[(1 * H + 1) * K + 0] = -1;
    std::sort(cleaned.begin() + (1 * H + 1) * K, cleaned.begin() + (1 * H + 2) * K,
              [](std::int32_t a, std::int32_t b) { return (a < 0) == (b < 0) ? a < b : b < 0; });
    // Request 2's block 2 on a page outside the cache: every token that selected
    // it loses it.
    const std::int64_t row2 = 2 * w.table_stride;
    const std::int32_t page = w.block_table[row2 + 2];
    w.block_table[row2 + 2] = std::int32_t(w.num_pages + 12345);
    expect_error([&] { msa::cpu::attend(w.step(), w.attention_args(), kChecked); }, {"block_table[r=2, b=2]"});
    const std::vector<std::uint8_t> got = attend_unchecked(w);

    w.block_table[row2 + 2] = page;
    for (std::int32_t t = w.meta().query_start[2]; t < w.meta().num_tokens; ++t) {
      for (int h = 0; h < H; ++h) {
        std::int32_t* ids = cleaned.data() + (std::size_t(t) * H + h) * K;
        std::replace(ids, ids + K, 2, -1);
        std::stable_partition(ids, ids + K, [](std::int32_t id) { return id >= 0; });
      }
    }
    w.topk = cleaned;
    std::fill(w.out.begin(), w.out.end(), std::uint8_t(0x55));
    msa::cpu::attend(w.step(), w.attention_args(), kChecked);
    EXPECT_TRUE(got == w.out) << "unchecked attend differs from the checked one on the cleaned lists";
  }
}

TEST(Unchecked, KeyMajorSkipsPagesOutsideTheCache) {
  Workload w = ready();
  const msa::AttentionArgs args = w.attention_args();
  const msa::K2QPlan plan = msa::build_k2q(w.step(), args.topk, w.model().num_kv_heads);
  const std::size_t n = msa::cpu::key_major_partial_floats(w.num_tokens(), args.num_q_heads, args.topk.topk);
  std::vector<float> partial(n), partial_lse(n / 128);
  w.block_table[2 * w.table_stride + 1] = -3;
  w.block_table[1 * w.table_stride + 0] = std::int32_t(w.num_pages);
  expect_error([&] { msa::cpu::attend_key_major(w.step(), args, plan, partial.data(), partial_lse.data(), kChecked); },
               "block_table[r=1, b=0]");
  EXPECT_NO_THROW(msa::cpu::attend_key_major(w.step(), args, plan, partial.data(), partial_lse.data(), kUnchecked));
  for (float l : w.lse) EXPECT_FALSE(std::isnan(l));
}

TEST(Unchecked, AttendOnAnEmptyCacheReadsNoTable) {
  Workload w = ready();
  msa::AttentionArgs a = w.attention_args();
  a.cache.num_pages = 0;
  a.block_table.data = nullptr;  // nothing to read: no pages
  std::fill(w.out.begin(), w.out.end(), std::uint8_t(0x55));
  msa::cpu::attend(w.step(), a, kUnchecked);
  for (float l : w.lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  for (std::uint8_t b : w.out) ASSERT_EQ(b, 0);
}

// ---- insert --------------------------------------------------------------------------

TEST(Unchecked, InsertSkipsSlotsBeyondTheCache) {
  Workload w(small_spec(DType::fp8_e5m2));
  const std::vector<std::uint8_t> kv_before = w.kv_bytes, index_before = w.index_bytes;
  std::vector<std::int64_t> slots(std::size_t(w.num_tokens()), w.num_pages * 128);
  slots[3] = std::numeric_limits<std::int64_t>::max();
  slots[4] = -1;  // padding, skipped in both modes
  msa::InsertKVArgs a = w.insert_kv_args();
  a.slots = slots.data();
  expect_error([&] { msa::cpu::insert_kv(w.kv_view(), a, kChecked); }, {"slots[0] = ", "but the cache has"});
  msa::cpu::insert_kv(w.kv_view(), a, kUnchecked);
  EXPECT_TRUE(w.kv_bytes == kv_before);
  msa::InsertIndexArgs ia = w.insert_index_args();
  ia.slots = slots.data();
  expect_error([&] { msa::cpu::insert_index(w.index_view(), ia, kChecked); }, {"index slots[0] = "});
  msa::cpu::insert_index(w.index_view(), ia, kUnchecked);
  EXPECT_TRUE(w.index_bytes == index_before);
}

}  // namespace
