// check::step_shape / step_data / block_table_data / topk_data: every check
// with a bad input and the expected message, and the good inputs they accept.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "msa/batch.hpp"
#include "msa/error.hpp"

namespace {

using msa::StepView;
using V = std::vector<std::int32_t>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const msa::Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_ERROR(call, fragment)                                          \
  do {                                                                        \
    const std::string msg_ = error_of([&] { call; });                         \
    EXPECT_NE(msg_.find(fragment), std::string::npos) << "message: " << msg_; \
  } while (0)

msa::BatchMetadata make(V query_lens, V seq_lens, int threshold = 1) {
  msa::BatchSpec s;
  s.query_lens = std::move(query_lens);
  s.seq_lens = std::move(seq_lens);
  s.decode_threshold = threshold;
  return msa::build_metadata(s);
}

// ---- step ---------------------------------------------------------------------

// Two decodes of 2 rows, then a prefill of 3 rows: 7 tokens.
struct StepFixture {
  V query_start{0, 2, 4, 7};
  V seq_lens{5, 2, 10};
  V token_request{0, 0, 1, 1, 2, 2, 2};
  StepView view() const {
    StepView v;
    v.num_requests = 3;
    v.num_tokens = 7;
    v.num_decodes = 2;
    v.num_decode_tokens = 4;
    v.decode_query_len = 2;
    v.query_start = query_start.data();
    v.seq_lens = seq_lens.data();
    v.token_request = token_request.data();
    return v;
  }
};

TEST(CheckStep, AcceptsGoodSteps) {
  StepFixture f;
  EXPECT_NO_THROW(msa::check::step_data(f.view()));
  EXPECT_NO_THROW(msa::check::step_data(make({}, {}).view()));
  EXPECT_NO_THROW(msa::check::step_data(make({1, 1, 0, 5}, {9, 0, 0, 0}).view()));
}

TEST(CheckStep, Shape) {
  using msa::check::step_shape;
  StepFixture f;
  StepView v = f.view();
  v.num_requests = -1;
  EXPECT_ERROR(step_shape(v), "step.num_requests = -1 is negative");
  v = f.view(), v.num_tokens = -2;
  EXPECT_ERROR(step_shape(v), "step.num_tokens = -2 is negative");
  v = f.view(), v.num_decodes = 4;
  EXPECT_ERROR(step_shape(v), "step.num_decodes = 4 is not in [0, num_requests = 3]");
  v = f.view(), v.decode_query_len = -1;
  EXPECT_ERROR(step_shape(v), "step.decode_query_len = -1 is negative");
  v = f.view(), v.decode_query_len = 0, v.num_decode_tokens = 0;
  EXPECT_ERROR(step_shape(v), "step.decode_query_len = 0 but the step has 2 decodes");
  v = f.view(), v.num_decode_tokens = 3;
  EXPECT_ERROR(step_shape(v), "step.num_decode_tokens = 3 but num_decodes * decode_query_len = 2 * 2 = 4");
  v = f.view(), v.num_tokens = 3;
  EXPECT_ERROR(step_shape(v), "step.num_decode_tokens = 4 exceeds num_tokens = 3");
  v = f.view(), v.query_start = nullptr;
  EXPECT_ERROR(step_shape(v), "step.query_start is null");
  v = f.view(), v.seq_lens = nullptr;
  EXPECT_ERROR(step_shape(v), "step.seq_lens is null but the step has 3 requests");
  v = f.view(), v.token_request = nullptr;
  EXPECT_ERROR(step_shape(v), "step.token_request is null but the step has 7 tokens");
}

TEST(CheckStep, Data) {
  using msa::check::step_data;
  {
    StepFixture f;
    f.query_start[0] = 1;
    EXPECT_ERROR(step_data(f.view()), "step.query_start[0] = 1 but must be 0");
  }
  {
    StepFixture f;
    f.query_start[2] = 1;
    EXPECT_ERROR(step_data(f.view()), "step.query_start[2] = 1 is below query_start[1] = 2");
  }
  {
    StepFixture f;
    f.query_start[2] = 8;
    EXPECT_ERROR(step_data(f.view()), "step.query_start[2] = 8 exceeds num_tokens = 7");
  }
  {
    StepFixture f;
    f.query_start[3] = 6;
    EXPECT_ERROR(step_data(f.view()), "step.query_start[3] = 6 but num_tokens = 7");
  }
  {
    StepFixture f;
    f.query_start[2] = 5;
    EXPECT_ERROR(step_data(f.view()), "step.query_start[num_decodes = 2] = 5 but num_decode_tokens = 4");
  }
  {
    StepFixture f;
    f.seq_lens[1] = -4;
    EXPECT_ERROR(step_data(f.view()), "step.seq_lens[1] = -4 is negative");
  }
  {
    StepFixture f;
    f.seq_lens[2] = 2;
    EXPECT_ERROR(step_data(f.view()), "step.seq_lens[2] = 2 is below the request's query length 3");
  }
  {
    StepFixture f;
    f.query_start[1] = 1;  // decode 0 has 1 row, decode 1 has 3
    EXPECT_ERROR(step_data(f.view()), "decode request 0 has query length 1 but decode_query_len = 2");
  }
  {
    StepFixture f;
    f.token_request[5] = 1;
    EXPECT_ERROR(step_data(f.view()),
                 "step.token_request[5] = 1 but query_start puts token 5 in request 2");
  }
  {
    StepFixture f;
    f.seq_lens[0] = 0;  // padding decode: fine
    EXPECT_NO_THROW(step_data(f.view()));
  }
}

// ---- block table ----------------------------------------------------------------

// Requests of 1, 8, 0 (padding) and 2 blocks; 4096 pages; 10 columns, stride 12.
struct TableFixture {
  msa::BatchMetadata meta = make({1, 1, 1, 1}, {100, 1000, 0, 129});
  std::vector<std::int32_t> data = std::vector<std::int32_t>(4 * 12, 0);
  TableFixture() {
    for (int r = 0; r < 4; ++r)
      for (int b = 0; b < 12; ++b) data[r * 12 + b] = b < meta.num_blocks(r) ? 37 * r + b : -7;
  }
  msa::BlockTable table() const { return msa::BlockTable{data.data(), 4, 10, 12}; }
  void check(std::int64_t num_pages = 4096) const {
    msa::check::block_table_data(meta.view(), table(), num_pages, "block_table");
  }
};

TEST(CheckBlockTable, AcceptsNeededEntriesAndIgnoresTheRest) {
  TableFixture f;
  EXPECT_NO_THROW(f.check());  // entries past each request's blocks hold -7
  f.data[2 * 12 + 0] = 99999;  // the padding request needs no blocks
  EXPECT_NO_THROW(f.check());
}

TEST(CheckBlockTable, Errors) {
  {
    TableFixture f;
    f.data[1 * 12 + 7] = 5000;
    EXPECT_ERROR(f.check(), "block_table[r=1, b=7] = 5000 but the cache has 4096 pages");
  }
  {
    TableFixture f;
    f.data[3 * 12 + 1] = -1;
    EXPECT_ERROR(f.check(), "block_table[r=3, b=1] = -1 is negative");
  }
  {
    TableFixture f;
    EXPECT_ERROR(f.check(5), "block_table[r=1, b=0] = 37 but the cache has 5 pages");
    EXPECT_ERROR(f.check(-1), "block_table: num_pages = -1 is negative");
  }
  TableFixture f;
  const StepView v = f.meta.view();
  msa::BlockTable t = f.table();
  t.num_rows = 3;
  EXPECT_ERROR(msa::check::block_table_data(v, t, 4096, "index_block_table"),
               "index_block_table.num_rows = 3 but the step has 4 requests");
  t = f.table(), t.max_blocks = 7;
  EXPECT_ERROR(msa::check::block_table_data(v, t, 4096, "block_table"),
               "block_table: request 1 has seq_len 1000 and needs 8 blocks but the table has 7 columns");
  t = f.table(), t.max_blocks = -1;
  EXPECT_ERROR(msa::check::block_table_data(v, t, 4096, "block_table"),
               "block_table.max_blocks = -1 is negative");
  t = f.table(), t.row_stride = 9;
  EXPECT_ERROR(msa::check::block_table_data(v, t, 4096, "block_table"),
               "block_table.row_stride = 9 is below max_blocks = 10");
  t = f.table(), t.data = nullptr;
  EXPECT_ERROR(msa::check::block_table_data(v, t, 4096, "block_table"),
               "block_table.data is null but the table has 4 requests x 10 columns over a cache of 4096 pages");
}

// ---- top-k ------------------------------------------------------------------------

// Request 0: decode at position 299 (blocks 0..2). Request 1: padding decode.
// Request 2: prefill, seq_len 5100 (40 blocks), 20 rows at positions 5080..5099
// (tokens 2..21). Two KV heads, topk 6, token-major.
struct TopkFixture {
  msa::BatchMetadata meta = make({1, 1, 20}, {300, 0, 5100});
  static constexpr int kHeads = 2, kTopk = 6;
  std::vector<std::int32_t> data = std::vector<std::int32_t>(22 * kHeads * kTopk, -1);
  TopkFixture() {
    for (int t = 0; t < 22; ++t) {
      const int p = meta.token_position[t];
      if (p < 0) continue;  // padding row: all -1
      for (int h = 0; h < kHeads; ++h)
        for (int k = 0; k < kTopk && k <= p / 128; ++k) at(t, h, k) = p / 128 - k;  // descending
    }
  }
  std::int32_t& at(int t, int h, int k) { return data[(t * kHeads + h) * kTopk + k]; }
  msa::TopkView view() { return msa::TopkView::token_major(data.data(), kHeads, kTopk); }
  void check(int begin = 0, int end = -1) {
    msa::check::topk_data(meta.view(), view(), kHeads, begin, end);
  }
};

TEST(CheckTopk, AcceptsGoodRows) {
  TopkFixture f;
  EXPECT_NO_THROW(f.check());
  f.at(0, 1, 0) = -1, f.at(0, 1, 1) = -1, f.at(0, 1, 2) = -1;  // fewer than eligible: allowed
  EXPECT_NO_THROW(f.check());
  // A [kv_head, token, topk] view of the same entries.
  std::vector<std::int32_t> head_major(f.data.size());
  for (int t = 0; t < 22; ++t)
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 6; ++k) head_major[(h * 22 + t) * 6 + k] = f.at(t, h, k);
  const msa::TopkView hm{head_major.data(), 6, 6, 22 * 6};
  EXPECT_NO_THROW(msa::check::topk_data(f.meta.view(), hm, 2, 0, 22));
  head_major[(1 * 22 + 17) * 6 + 3] = 912;
  EXPECT_ERROR(msa::check::topk_data(f.meta.view(), hm, 2, 0, 22),
               "topk[t=17, h=1, k=3] = 912 but request 2 has 40 blocks");
}

TEST(CheckTopk, Errors) {
  {
    TopkFixture f;
    f.at(17, 0, 3) = 912;
    EXPECT_ERROR(f.check(), "topk[t=17, h=0, k=3] = 912 but request 2 has 40 blocks");
  }
  {
    TopkFixture f;
    f.at(0, 1, 1) = 3;  // position 299: blocks 0..2, request has 3 blocks
    EXPECT_ERROR(f.check(), "topk[t=0, h=1, k=1] = 3 but request 0 has 3 blocks");
  }
  {
    TopkFixture f;
    // Position 5080 allows blocks 0..39 and the request has 40: all good; make
    // the request longer so that only the causal limit catches the id.
    f.meta = make({1, 1, 20}, {300, 0, 5300});  // positions 5280..5299, 42 blocks
    f.at(2, 0, 2) = 41;  // 5280 / 128 = 41: eligible
    EXPECT_NO_THROW(f.check());
    f.meta = make({1, 1, 20}, {300, 0, 5230});  // positions 5210..5229, 41 blocks
    f.at(2, 0, 2) = 40;  // 5210 / 128 = 40: eligible
    EXPECT_NO_THROW(f.check());
    f.meta = make({1, 1, 200}, {300, 0, 5200});  // token 2 at position 5000 allows 0..39
    f.data.assign(202 * 2 * 6, -1);
    f.at(2, 1, 0) = 40;
    EXPECT_ERROR(msa::check::topk_data(f.meta.view(), msa::TopkView::token_major(f.data.data(), 2, 6),
                                       2, 0, -1),
                 "topk[t=2, h=1, k=0] = 40 but the token's position 5000 allows blocks 0..39");
  }
  {
    TopkFixture f;
    f.at(1, 0, 0) = 0;  // padding row
    EXPECT_ERROR(f.check(), "topk[t=1, h=0, k=0] = 0 but request 1 has 0 blocks");
  }
  {
    TopkFixture f;
    f.at(5, 1, 4) = -3;
    EXPECT_ERROR(f.check(), "topk[t=5, h=1, k=4] = -3 is neither -1 nor a block id");
  }
  {
    TopkFixture f;
    f.at(0, 0, 1) = -1;  // then k=2 holds block 0
    EXPECT_ERROR(f.check(), "topk[t=0, h=0, k=2] = 0 follows a -1 at k=1");
  }
  {
    TopkFixture f;
    f.at(9, 0, 5) = f.at(9, 0, 2);
    EXPECT_ERROR(f.check(), "topk[t=9, h=0, k=5] = " + std::to_string(f.at(9, 0, 2)) +
                                " repeats topk[t=9, h=0, k=2]");
  }
  {
    TopkFixture f;
    EXPECT_ERROR(msa::check::topk_data(f.meta.view(), f.view(), 0, 0, -1),
                 "num_kv_heads = 0 must be >= 1");
    msa::TopkView v = f.view();
    v.topk = 0;
    EXPECT_ERROR(msa::check::topk_data(f.meta.view(), v, 2, 0, -1), "topk.topk = 0 must be in [1, 64]");
    v.topk = 65;
    EXPECT_ERROR(msa::check::topk_data(f.meta.view(), v, 2, 0, -1), "topk.topk = 65 must be in [1, 64]");
    EXPECT_ERROR(f.check(5, 3), "top-k token range [5, 3) is not inside [0, num_tokens = 22]");
    EXPECT_ERROR(f.check(0, 23), "top-k token range [0, 23) is not inside [0, num_tokens = 22]");
    EXPECT_ERROR(f.check(-1, 3), "top-k token range [-1, 3) is not inside [0, num_tokens = 22]");
    v = f.view(), v.data = nullptr;
    EXPECT_ERROR(msa::check::topk_data(f.meta.view(), v, 2, 0, -1), "topk.data is null");
    EXPECT_NO_THROW(msa::check::topk_data(f.meta.view(), v, 2, 4, 4));  // empty range
  }
  {
    // A broken step is reported before any top-k entry.
    TopkFixture f;
    StepView s = f.meta.view();
    s.num_decode_tokens = 1;
    EXPECT_ERROR(msa::check::topk_data(s, f.view(), 2, 0, -1), "step.num_decode_tokens = 1");
  }
}

TEST(CheckTopk, OnlyTheRangeIsRead) {
  TopkFixture f;
  f.at(0, 0, 0) = 500;
  f.at(21, 1, 0) = -9;
  EXPECT_NO_THROW(f.check(1, 21));
  EXPECT_ERROR(f.check(1, 22), "topk[t=21, h=1, k=0] = -9");
  EXPECT_ERROR(f.check(0, 1), "topk[t=0, h=0, k=0] = 500");
}

}  // namespace
