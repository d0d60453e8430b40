// msa::Workload (tests/support/workload.*): shuffled block tables that are
// injective (a permutation when there are no spare pages), slot mappings that
// agree with the tables and positions, sane metadata, the cached context in the
// cache and the new tokens not yet, poisoned outputs, unit-variance values,
// determinism across thread counts, clustered selections, and spec checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "../../tools/msa/index_agreement.hpp"
#include "cache_reader.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "workload.hpp"

namespace {

using msa::DType;
using msa::Layout;
using msa::RequestShape;
using msa::ScaleMode;
using msa::Workload;
using msa::WorkloadSpec;

// Decodes with two query tokens, odd contexts, a padding request in the middle
// of nothing (at the end: padding rows own no tokens), and two prefills.
WorkloadSpec mixed_spec(std::uint64_t seed, int tp = 4) {
  WorkloadSpec s;
  s.model = msa::ModelConfig::minimax_m3(tp);
  s.seed = seed;
  s.decode_threshold = 2;
  s.requests = {{2, 127}, {2, 1}, {2, 2047}, {129, 0}, {200, 2049}, {0, 0}};
  s.num_threads = 2;
  return s;
}

std::string describe(const WorkloadSpec& s) {
  return msa::detail::concat("seed ", s.seed, ", kv ", msa::dtype_name(s.kv_dtype), ", layout ",
                             msa::layout_name(s.layout), ", q ", msa::dtype_name(s.q_dtype),
                             ", heads ", s.model.num_q_heads, "/", s.model.num_kv_heads);
}

// Every page a request uses, in [0, pages), used once; -1 past each row's blocks.
void expect_injective(const Workload& w, const std::vector<std::int32_t>& table, std::int64_t pages,
                      bool permutation) {
  std::vector<int> used(std::size_t(pages), 0);
  std::int64_t count = 0;
  for (std::int32_t r = 0; r < w.num_requests(); ++r) {
    const std::int32_t blocks = w.meta().num_blocks(r);
    for (std::int64_t b = 0; b < w.table_stride; ++b) {
      const std::int32_t page = table[r * w.table_stride + b];
      if (b >= blocks) {
        EXPECT_EQ(page, -1) << "row " << r << " column " << b;
        continue;
      }
      ASSERT_GE(page, 0) << "row " << r << " block " << b;
      ASSERT_LT(page, pages) << "row " << r << " block " << b;
      EXPECT_EQ(used[page]++, 0) << "page " << page << " used twice (row " << r << ", block " << b
                                 << ")";
      ++count;
    }
  }
  if (permutation) {
    EXPECT_EQ(count, pages);
  }
}

TEST(Workload, BlockTablesArePermutations) {
  for (std::int64_t spare : {0, -1, 7}) {
    WorkloadSpec s = mixed_spec(11 + std::uint64_t(spare + 1));
    s.spare_pages = spare;
    SCOPED_TRACE(describe(s) + ", spare " + std::to_string(spare));
    const Workload w(s);
    std::int64_t used = 0;
    for (std::int32_t r = 0; r < w.num_requests(); ++r) used += w.meta().num_blocks(r);
    EXPECT_EQ(w.num_pages, used + (spare >= 0 ? spare : used / 8 + 1));
    EXPECT_GT(w.table_stride, w.max_blocks);
    expect_injective(w, w.block_table, w.num_pages, spare == 0);
    expect_injective(w, w.index_block_table, w.index_num_pages, spare == 0);
    EXPECT_NE(w.block_table, w.index_block_table) << "the index cache must have its own shuffle";
    // Shuffled: the longest request's pages are not one ascending run.
    bool contiguous = true;
    for (std::int32_t b = 1; b < w.meta().num_blocks(4); ++b)
      contiguous &= w.page(4, b) == w.page(4, b - 1) + 1;
    EXPECT_FALSE(contiguous);
  }
}

TEST(Workload, SlotsFollowTablesAndPositions) {
  const WorkloadSpec s = mixed_spec(5);
  SCOPED_TRACE(describe(s));
  const Workload w(s);
  const msa::BatchMetadata& m = w.meta();
  ASSERT_EQ(std::int64_t(w.slots.size()), m.num_tokens);
  ASSERT_EQ(std::int64_t(w.index_slots.size()), m.num_tokens);
  std::set<std::int64_t> seen;
  for (std::int32_t t = 0; t < m.num_tokens; ++t) {
    const std::int32_t r = m.token_request[t], p = m.token_position[t];
    ASSERT_GE(p, m.context_lens[r]) << "token " << t;
    EXPECT_EQ(w.slots[t], std::int64_t(w.page(r, p / 128)) * 128 + p % 128) << "token " << t;
    EXPECT_EQ(w.index_slots[t], std::int64_t(w.index_page(r, p / 128)) * 128 + p % 128)
        << "token " << t;
    EXPECT_TRUE(seen.insert(w.slots[t]).second) << "slot " << w.slots[t] << " written twice";
  }
}

TEST(Workload, MetadataIsSane) {
  const WorkloadSpec s = mixed_spec(3);
  SCOPED_TRACE(describe(s));
  const Workload w(s);
  const msa::BatchMetadata& m = w.meta();
  EXPECT_EQ(m.num_requests, 6);
  EXPECT_EQ(m.num_decodes, 3);
  EXPECT_EQ(m.decode_query_len, 2);
  EXPECT_EQ(m.num_decode_tokens, 6);
  EXPECT_EQ(m.num_prefills, 3);
  EXPECT_EQ(m.num_tokens, 6 + 129 + 200);
  for (std::size_t r = 0; r < s.requests.size(); ++r) {
    const RequestShape& q = s.requests[r];
    EXPECT_EQ(m.query_start[r + 1] - m.query_start[r], q.query_len) << "request " << r;
    EXPECT_EQ(m.seq_lens[r], q.query_len + q.context_len) << "request " << r;
  }
  EXPECT_EQ(w.max_blocks, (200 + 2049 + 127) / 128);
  const msa::StepView v = w.step();
  EXPECT_EQ(v.num_tokens, m.num_tokens);
  EXPECT_EQ(v.position(m.num_tokens - 1), 2049 + 199);
  // Buffer sizes of the step.
  const std::size_t T = std::size_t(m.num_tokens), QH = 16, H = 1, D = 128;
  EXPECT_EQ(w.q.size(), T * QH * D * 2);
  EXPECT_EQ(w.index_q.size(), T * H * D * 2);
  EXPECT_EQ(w.new_k.size(), T * H * D * 2);
  EXPECT_EQ(w.new_index_k.size(), T * D * 2);
  EXPECT_EQ(w.topk.size(), T * H * 16);
  EXPECT_EQ(w.out.size(), T * QH * D * 2);
  EXPECT_EQ(w.lse.size(), T * QH);
}

TEST(Workload, ContextIsCachedAndNewTokensAreNot) {
  for (DType kv : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
    WorkloadSpec s = mixed_spec(21, 1);  // 4 KV heads
    s.kv_dtype = kv;
    s.layout = Layout::nhd;
    SCOPED_TRACE(describe(s));
    Workload w(s);
    const msa::BlockTable table = w.table();
    const std::int32_t r = 4;  // 2049 cached + 200 new tokens
    const std::int64_t seq = w.meta().seq_lens[r], context = w.meta().context_lens[r];
    for (int h = 0; h < 4; ++h) {
      msa::ref::HeadKV kv_before = msa::ref::read_kv(w.kv_view(), table, r, h, seq);
      for (std::int64_t j = 0; j < seq; j += 37) {
        const bool finite =
            std::isfinite(kv_before.k[j * 128]) && std::isfinite(kv_before.v[j * 128 + 5]);
        // nvfp4 has no NaN element: its poison is a NaN group scale.
        EXPECT_EQ(finite, j < context) << "head " << h << " position " << j;
      }
    }
    msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), w.cpu_options());
    const msa::ref::HeadKV after = msa::ref::read_kv(w.kv_view(), table, r, 2, seq);
    for (std::int64_t j = 0; j < seq; ++j)
      ASSERT_TRUE(std::isfinite(after.k[j * 128 + 127])) << "position " << j;
  }
}

TEST(Workload, OutputsArePoisoned) {
  Workload w(mixed_spec(8));
  for (std::int32_t id : w.topk) ASSERT_EQ(id, std::numeric_limits<std::int32_t>::min());
  for (float x : w.lse) ASSERT_TRUE(std::isnan(x));
  const std::vector<double> out =
      msa::ref::read_array(w.out.data(), w.out_dtype(), std::int64_t(w.lse.size()) * 128);
  for (double x : out) ASSERT_TRUE(std::isnan(x));
}

// Mean and variance of n values of `dtype` at `data`.
std::pair<double, double> moments(const void* data, DType dtype, std::int64_t n,
                                  double scale = 1.0) {
  const std::vector<double> x = msa::ref::read_array(data, dtype, n, scale);
  double sum = 0.0, sq = 0.0;
  for (double v : x) sum += v, sq += v * v;
  const double mean = sum / double(n);
  return {mean, sq / double(n) - mean * mean};
}

TEST(Workload, ValuesHaveUnitVariance) {
  for (DType q : {DType::bf16, DType::fp16, DType::fp8_e4m3}) {
    WorkloadSpec s = mixed_spec(31);
    s.q_dtype = q;
    SCOPED_TRACE(describe(s));
    const Workload w(s);
    const std::int64_t T = w.num_tokens();
    const DType src = w.src_dtype();
    EXPECT_EQ(src, q == DType::fp16 ? DType::fp16 : DType::bf16);
    for (auto [name, m] : {std::pair{"q", moments(w.q.data(), q, T * 16 * 128,
                                                  q == DType::fp8_e4m3 ? w.q_scale : 1.0)},
                           std::pair{"new_k", moments(w.new_k.data(), src, T * 128)},
                           std::pair{"new_v", moments(w.new_v.data(), src, T * 128)},
                           std::pair{"new_index_k", moments(w.new_index_k.data(), src, T * 128)},
                           std::pair{"index_q", moments(w.index_q.data(), src, T * 128)}}) {
      EXPECT_NEAR(m.first, 0.0, 0.25) << name;
      EXPECT_NEAR(m.second, 1.0, 0.3) << name;
    }
  }
}

TEST(Workload, DeterministicAcrossThreadsAndSeedsDiffer) {
  WorkloadSpec s = mixed_spec(77, 2);
  s.kv_dtype = DType::fp8_e5m2;
  s.fp8_scales = ScaleMode::per_token_head;
  s.num_threads = 1;
  const Workload a(s);
  s.num_threads = 2;
  const Workload b(s);
  EXPECT_EQ(a.kv_bytes, b.kv_bytes);
  // Bitwise: unused scale slots hold NaN.
  ASSERT_EQ(a.k_scales.size(), b.k_scales.size());
  EXPECT_EQ(0,
            std::memcmp(a.k_scales.data(), b.k_scales.data(), a.k_scales.size() * sizeof(float)));
  EXPECT_EQ(a.index_bytes, b.index_bytes);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.index_q, b.index_q);
  EXPECT_EQ(a.block_table, b.block_table);
  s.seed = 78;
  const Workload c(s);
  EXPECT_NE(a.kv_bytes, c.kv_bytes);
  EXPECT_NE(a.q, c.q);
  EXPECT_NE(a.block_table, c.block_table);
}

TEST(Workload, NeighbouringQueriesSelectMostlyTheSameBlocks) {
  WorkloadSpec s;
  s.model = msa::ModelConfig::minimax_m3(4);
  s.seed = 123;
  s.requests = {{300, 12000}};
  s.num_threads = 2;
  SCOPED_TRACE(describe(s));
  Workload w(s);
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), w.cpu_options());
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), w.cpu_options());
  msa::cpu::index(w.step(), w.indexer_args(), w.cpu_options());
  double overlap = 0.0;
  std::set<std::int32_t> distinct;
  for (std::int32_t t = 0; t < w.num_tokens(); ++t) {
    const std::int32_t* row = w.topk.data() + t * 16;
    distinct.insert(row, row + 16);
    if (t == 0) continue;
    const std::int32_t* prev = row - 16;
    int common = 0;
    for (int k = 0; k < 16; ++k) common += std::count(prev, prev + 16, row[k]) > 0;
    overlap += common / 16.0;
  }
  overlap /= w.num_tokens() - 1;
  EXPECT_GT(overlap, 0.6) << "neighbouring tokens should share most blocks";
  EXPECT_GT(distinct.size(), 24u) << "the selection should drift along the chunk";
  EXPECT_LT(distinct.size(), 96u);  // of 97 blocks: not uniform noise either
}

// workload_bytes() knows, from the spec alone, what the Workload allocates.
TEST(Workload, BytesAreKnownBeforeAllocating) {
  struct Variant {
    DType kv, q;
    ScaleMode scales;
    std::int64_t page_stride;
    DType index;
    bool twin;
  };
  for (const Variant v : {Variant{DType::bf16, DType::bf16, ScaleMode::per_tensor, 0, DType::bf16, false},
                          Variant{DType::fp8_e4m3, DType::fp16, ScaleMode::per_token_head, 0, DType::fp8_e4m3, true},
                          Variant{DType::fp8_e5m2, DType::fp8_e4m3, ScaleMode::per_tensor, 3 * 128 * 256, DType::bf16,
                                  false},
                          Variant{DType::nvfp4, DType::bf16, ScaleMode::per_tensor, 0, DType::nvfp4, true},
                          Variant{DType::nvfp4, DType::bf16, ScaleMode::per_tensor, 9216 * 4 + 512, DType::fp8_e4m3,
                                  false}}) {
    WorkloadSpec s = mixed_spec(3, 2);
    s.kv_dtype = v.kv;
    s.q_dtype = v.q;
    s.fp8_scales = v.scales;
    s.page_stride = v.page_stride;
    s.index_dtype = v.index;
    s.fp8_index_query = v.index == DType::fp8_e4m3;
    s.bf16_index_twin = v.twin;
    SCOPED_TRACE(describe(s));
    const msa::WorkloadBytes b = msa::workload_bytes(s);
    const Workload w(s);
    const auto bytes = [](const auto& vec) { return double(vec.size() * sizeof(vec[0])); };
    EXPECT_EQ(b.kv_cache, bytes(w.kv_bytes) + bytes(w.k_scales) + bytes(w.v_scales));
    EXPECT_EQ(b.index_cache, bytes(w.index_bytes) + bytes(w.twin_index_bytes));
    const double step = bytes(w.block_table) + bytes(w.index_block_table) + bytes(w.new_k) + bytes(w.new_v) +
                        bytes(w.new_index_k) + bytes(w.slots) + bytes(w.index_slots) + bytes(w.q) + bytes(w.index_q) +
                        bytes(w.index_q_e4m3) + bytes(w.topk) + bytes(w.twin_topk) + bytes(w.out) + bytes(w.lse) +
                        bytes(w.meta().token_request) + bytes(w.meta().token_position);
    EXPECT_GE(b.step, step);
    EXPECT_LE(b.step, step + 7 * 4 * w.num_requests() + 12);  // the per-request metadata
    EXPECT_GT(b.scratch, 0);
  }
  WorkloadSpec bad = mixed_spec(1);
  bad.requests[0].query_len = -1;
  EXPECT_THROW(msa::workload_bytes(bad), msa::Error);
  // A step far beyond any machine is sized without allocating it.
  WorkloadSpec huge = mixed_spec(1);
  huge.requests.assign(4096, RequestShape{2, 16 << 20});
  EXPECT_GT(msa::workload_bytes(huge).total(), 3e13);
}

// A low-precision index cache with its bf16 twin: the twin holds the bytes a
// bf16 workload of the same seed holds, the fp8 index query is the plain cast
// of the src_dtype one, and the agreement of the selections is counted right.
TEST(Workload, LowPrecisionIndexAndItsBf16Twin) {
  WorkloadSpec s = mixed_spec(55);
  s.requests = {{2, 3000}, {2, 2047}, {300, 2500}};
  Workload bf16(s);
  const std::vector<std::uint8_t> context = bf16.index_bytes;  // before the step's keys
  msa::cpu::insert_index(bf16.index_view(), bf16.insert_index_args(), bf16.cpu_options());
  msa::cpu::index(bf16.step(), bf16.indexer_args(), bf16.cpu_options());
  for (DType dt : {DType::fp8_e4m3, DType::nvfp4}) {
    s.index_dtype = dt;
    s.fp8_index_query = dt == DType::fp8_e4m3;
    s.bf16_index_twin = true;
    SCOPED_TRACE(describe(s) + ", index " + msa::dtype_name(dt));
    Workload w(s);
    EXPECT_EQ(w.index_bytes.size(), std::size_t(w.index_num_pages * msa::index_page_bytes(dt)));
    EXPECT_EQ(w.index_view().global_scale, dt == DType::nvfp4 ? 1.0f / 256.0f : 1.0f);
    const msa::IndexerArgs args = w.indexer_args();
    EXPECT_EQ(args.iq_dtype, dt == DType::fp8_e4m3 ? DType::fp8_e4m3 : DType::bf16);
    if (dt == DType::fp8_e4m3) {
      ASSERT_EQ(w.index_q_e4m3.size(), w.index_q.size() / 2);
      for (std::size_t i = 0; i < w.index_q_e4m3.size(); ++i) {
        std::uint16_t h;
        std::memcpy(&h, w.index_q.data() + 2 * i, 2);
        ASSERT_EQ(w.index_q_e4m3[i], msa::num::float_to_e4m3(msa::num::bf16_to_float(h))) << i;
      }
    }
    EXPECT_TRUE(w.twin_index_bytes == context) << "the cached context of the twin";
    msa::cpu::insert_index(w.index_view(), w.insert_index_args(), w.cpu_options());
    msa::cpu::insert_index(w.twin_index_view(), w.insert_index_args(), w.cpu_options());
    msa::cpu::index(w.step(), args, w.cpu_options());
    msa::cpu::index(w.step(), w.twin_indexer_args(), w.cpu_options());
    EXPECT_TRUE(w.twin_index_bytes == bf16.index_bytes) << "with the step's keys";
    EXPECT_EQ(w.twin_topk, bf16.topk);
    // Against itself: everything kept. Against the bf16 index: most of it.
    const auto self = msa::tool::index_agreement(w.meta(), w.model(), w.twin_topk, w.twin_topk);
    EXPECT_EQ(self.kept, self.reference_blocks);
    EXPECT_EQ(self.identical_rows, self.rows);
    // Rows with a choice: p >= 16 * 128, so every token but those of request 1 at p < 2048.
    EXPECT_EQ(self.rows, 2 + 1 + 300);
    EXPECT_EQ(self.reference_blocks, self.rows * 15);  // 16 selected, the local block forced
    const auto a = msa::tool::index_agreement(w.meta(), w.model(), w.topk, w.twin_topk);
    EXPECT_GT(a.fraction(), 0.8);
    EXPECT_LT(a.identical_rows, a.rows) << "low-precision scores should move some selections";
  }
}

// The agreement's counting on hand-made rows: forced blocks and rows without a
// choice do not count.
TEST(Workload, IndexAgreementCountsNonForcedBlocksOfRowsWithAChoice) {
  msa::BatchSpec spec;
  spec.query_lens = {1, 1, 1};
  spec.seq_lens = {5 * 128 + 1, 3 * 128, 0};  // last blocks 5 and 2 (no choice for topk 3), padding
  spec.decode_threshold = 1;
  const msa::BatchMetadata meta = msa::build_metadata(spec);
  msa::ModelConfig m = msa::ModelConfig::minimax_m3(8);  // one KV head
  m.topk = 3;
  m.init_blocks = 1;
  m.local_blocks = 1;
  const std::vector<std::int32_t> ref = {0, 3, 5, 0, 1, 2, -1, -1, -1};
  const std::vector<std::int32_t> got = {0, 4, 5, 0, 2, 1, -1, -1, -1};
  const auto a = msa::tool::index_agreement(meta, m, got, ref);
  EXPECT_EQ(a.rows, 1);
  EXPECT_EQ(a.reference_blocks, 1);  // block 3; 0 (init) and 5 (local) are forced
  EXPECT_EQ(a.kept, 0);
  EXPECT_EQ(a.fraction(), 0.0);
  EXPECT_EQ(a.identical_rows, 0);
  EXPECT_THROW(msa::tool::index_agreement(meta, m, got, {}), msa::Error);
}

TEST(Workload, PageStrideAndViews) {
  WorkloadSpec s = mixed_spec(9);
  const std::int64_t page = 1 * 128 * 256;
  s.page_stride = 3 * page;  // three layers per block, outer
  s.layout = Layout::split;
  const Workload w(s);
  EXPECT_EQ(std::int64_t(w.kv_bytes.size()), ((w.num_pages - 1) * 3 * page + page) * 2);
  char dummy[16];
  const msa::KVCacheView v = w.kv_view_at(dummy, nullptr, nullptr);
  EXPECT_EQ(v.k, static_cast<void*>(dummy));
  EXPECT_EQ(v.page_stride, 3 * page);
  EXPECT_EQ(v.num_pages, w.num_pages);
  const msa::BlockTable t = w.table_at(w.block_table.data());
  EXPECT_EQ(t.row_stride, w.table_stride);
  EXPECT_EQ(t.num_rows, w.num_requests());
}

TEST(Workload, RejectsBadSpecs) {
  auto expect_error = [](WorkloadSpec s, const std::string& needle) {
    try {
      Workload w(s);
      ADD_FAILURE() << "no msa::Error (expected '" << needle << "')";
    } catch (const msa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  WorkloadSpec s = mixed_spec(1);
  s.kv_dtype = DType::f32;
  expect_error(s, "kv_dtype");
  s = mixed_spec(1);
  s.index_dtype = DType::fp16;
  expect_error(s, "index_dtype");
  s = mixed_spec(1);
  s.index_dtype = DType::nvfp4;
  s.fp8_index_query = true;
  expect_error(s, "fp8_index_query needs an fp8_e4m3 index cache, not nvfp4");
  s = mixed_spec(1);
  s.requests[1].query_len = -1;
  expect_error(s, "requests[1]");
  s = mixed_spec(1);
  s.requests = {{300, 0}, {1, 10}};
  s.decode_threshold = 1;
  expect_error(s, "decode");  // a decode after a prefill (build_metadata)
  s = mixed_spec(1);
  s.model.topk = 0;
  expect_error(s, "topk");
}

}  // namespace
