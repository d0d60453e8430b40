// GPU tests of the device k2q plan (msa::cuda::build_k2q): it equals the CPU
// plan (msa::build_k2q) exactly on random batches (decodes, prefills, padding
// requests, partial lists, token- and head-major top-k layouts, 1..8 KV heads,
// top-k 1 / 16 / 64), on a long prefill, on prefills sorted at each chunk size
// of the chunk sort (random and shared lists), on a step of many requests
// (the device-wide sort), on an empty step, and skips and records ineligible
// and repeated entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/k2q/build.hpp"
#include "gpu_test_util.hpp"
#include "msa/batch.hpp"
#include "msa/cuda.hpp"
#include "msa/k2q.hpp"

namespace {

using msa::test::DeviceBuffer;

// A random batch: decodes (some padding), then prefills with context (some
// padding, some without new tokens); `long_prefill` adds one of that many tokens.
msa::BatchMetadata random_batch(std::mt19937& rng, int long_prefill = 0) {
  msa::BatchSpec s;
  const int dql = 1 + int(rng() % 3);
  s.decode_threshold = dql;
  const int decodes = int(rng() % 6), prefills = 1 + int(rng() % 4);
  for (int i = 0; i < decodes; ++i) {
    s.query_lens.push_back(dql);
    s.seq_lens.push_back(rng() % 6 == 0 ? 0 : dql + int(rng() % 3000));
  }
  for (int i = 0; i < prefills; ++i) {
    const int q = rng() % 8 == 0 ? 0 : dql + 1 + int(rng() % 400);
    s.query_lens.push_back(q);
    s.seq_lens.push_back(rng() % 8 == 0 ? 0 : q + int(rng() % 2000));
  }
  if (long_prefill > 0) {
    s.query_lens.push_back(long_prefill);
    s.seq_lens.push_back(long_prefill + 5000);
  }
  return msa::build_metadata(s);
}

// Random valid lists: n distinct eligible ids (n = all that fit, or fewer),
// in random order, then -1. Layout token-major or head-major.
struct Topk {
  std::vector<std::int32_t> data;
  std::int64_t token_stride = 0, head_stride = 0;
  int topk = 0;
  msa::TopkView view(std::int32_t* base) const { return msa::TopkView{base, topk, token_stride, head_stride}; }
};
Topk random_topk(std::mt19937& rng, const msa::BatchMetadata& m, int heads, int topk, bool head_major) {
  Topk out;
  out.topk = topk;
  out.data.assign(std::size_t(m.num_tokens) * heads * topk, -1);
  out.token_stride = head_major ? topk : std::int64_t(heads) * topk;
  out.head_stride = head_major ? std::int64_t(m.num_tokens) * topk : topk;
  std::vector<std::int32_t> pool;
  for (int t = 0; t < m.num_tokens; ++t) {
    const int p = m.token_position[t];
    if (p < 0) continue;
    const int eligible = p / 128 + 1;
    for (int h = 0; h < heads; ++h) {
      std::int32_t* row = out.data.data() + t * out.token_stride + h * out.head_stride;
      const int full = std::min(topk, eligible);
      const int n = rng() % 4 == 0 ? int(rng() % (full + 1)) : full;
      pool.resize(std::size_t(eligible));
      std::iota(pool.begin(), pool.end(), 0);
      for (int k = 0; k < n; ++k) {
        std::swap(pool[std::size_t(k)], pool[std::size_t(k) + rng() % std::size_t(eligible - k)]);
        row[k] = pool[std::size_t(k)];
      }
    }
  }
  return out;
}

std::int64_t rows_per_head(const msa::BatchMetadata& m) {
  std::int64_t rows = 0;
  for (int r = 0; r < m.num_requests; ++r) rows += m.num_blocks(r);
  return rows;
}

// The device plan of (m, topk), downloaded; `check` receives bad entries.
struct GpuPlan {
  std::vector<std::int64_t> offsets;
  std::vector<std::int32_t> tokens, slots, counts;
};
GpuPlan gpu_plan(const msa::BatchMetadata& m, const Topk& topk, int heads, const msa::test::CheckBuffer& check) {
  msa::test::DeviceStep step(m);
  DeviceBuffer<std::int32_t> ids(topk.data.empty() ? std::vector<std::int32_t>{-1} : topk.data);
  const std::int64_t rows = rows_per_head(m);
  const std::size_t edges = std::max<std::size_t>(1, topk.data.size());
  DeviceBuffer<std::int64_t> offsets(std::size_t(rows * heads + 1));
  DeviceBuffer<std::int32_t> tokens(edges), slots(edges), counts(std::max(1, m.num_tokens * heads));
  offsets.poison_nan();
  tokens.poison_nan();
  slots.poison_nan();
  counts.poison_nan();
  const std::size_t bytes = msa::cuda::k2q_workspace_bytes(m.num_tokens, m.num_requests, heads, topk.topk, rows);
  DeviceBuffer<unsigned char> workspace(std::max<std::size_t>(1, bytes));
  workspace.poison_nan();
  const msa::cuda::K2QDevicePlan plan{offsets.data(), tokens.data(), slots.data(), counts.data()};
  msa::cuda::build_k2q(step.view, topk.view(ids.data()), heads, rows, plan, workspace.data(), bytes, nullptr,
                       check.get());
  msa::test::device_sync();
  GpuPlan g;
  g.offsets = offsets.download();
  const auto nnz = std::size_t(g.offsets.back());
  g.tokens = tokens.download();
  g.slots = slots.download();
  g.tokens.resize(nnz);
  g.slots.resize(nnz);
  g.counts = counts.download();
  g.counts.resize(std::size_t(m.num_tokens) * heads);
  return g;
}

void expect_same(const msa::K2QPlan& cpu, const GpuPlan& gpu) {
  ASSERT_EQ(cpu.offsets.size(), gpu.offsets.size());
  for (std::size_t i = 0; i < cpu.offsets.size(); ++i)
    ASSERT_EQ(cpu.offsets[i], gpu.offsets[i]) << "offsets[" << i << "]";
  ASSERT_EQ(cpu.tokens.size(), gpu.tokens.size());
  for (std::size_t i = 0; i < cpu.tokens.size(); ++i) {
    ASSERT_EQ(cpu.tokens[i], gpu.tokens[i]) << "tokens[" << i << "]";
    ASSERT_EQ(cpu.slots[i], gpu.slots[i]) << "slots[" << i << "]";
  }
  ASSERT_EQ(cpu.counts, gpu.counts);
}

// The device plan of (m, ids) equals the CPU plan, with nothing recorded;
// returns the CPU plan.
msa::K2QPlan expect_matches_cpu_plan(const msa::BatchMetadata& m, const Topk& ids, int heads) {
  Topk host = ids;
  msa::K2QPlan cpu = msa::build_k2q(m.view(), host.view(host.data.data()), heads);
  msa::test::CheckBuffer check;
  const GpuPlan gpu = gpu_plan(m, ids, heads, check);
  EXPECT_EQ(check.message(), "");
  expect_same(cpu, gpu);
  return cpu;
}

TEST(CudaK2Q, MatchesCpuPlanOnRandomBatches) {
  MSA_SKIP_WITHOUT_GPU();
  const int cases = msa::test::size_for(24, 4);
  for (int c = 0; c < cases; ++c) {
    const std::uint64_t seed = msa::test::seed_for(7000 + c);
    MSA_TRACE_SEED(seed);
    std::mt19937 rng{std::uint32_t(seed)};
    const msa::BatchMetadata m = random_batch(rng);
    const int heads = 1 << (c % 4);              // 1, 2, 4, 8
    const int topk = c % 3 == 0 ? 1 : c % 3 == 1 ? 16 : 64;
    const Topk ids = random_topk(rng, m, heads, topk, c % 2 == 1);
    expect_matches_cpu_plan(m, ids, heads);
  }
}

TEST(CudaK2Q, MatchesCpuPlanOnALongPrefill) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(7100);
  MSA_TRACE_SEED(seed);
  std::mt19937 rng{std::uint32_t(seed)};
  const msa::BatchMetadata m = random_batch(rng, msa::test::size_for(8192, 300));
  const Topk ids = random_topk(rng, m, 4, 16, false);
  EXPECT_TRUE(msa::cuda::k2q_sorts_in_chunks(m.num_tokens, 4, 16, rows_per_head(m)));
  const msa::K2QPlan cpu = expect_matches_cpu_plan(m, ids, 4);
  std::printf("[k2q] %d tokens, %zu rows, %zu edges\n", m.num_tokens, cpu.offsets.size() - 1, cpu.tokens.size());
}

// One prefill sized for each chunk size of the chunk sort (its last chunk
// partly filled), with random lists and with lists that all name the same
// blocks (each row's edges running through every chunk).
TEST(CudaK2Q, ChunkSortMatchesCpuPlanAtEachChunkSize) {
  MSA_SKIP_WITHOUT_GPU();
  for (const int tokens : {msa::test::size_for(5001, 700), msa::test::size_for(20011, 1500),
                           msa::test::size_for(40009, 2100)}) {
    for (const bool shared : {false, true}) {
      const std::uint64_t seed = msa::test::seed_for(7120 + tokens + shared);
      MSA_TRACE_SEED(seed);
      std::mt19937 rng{std::uint32_t(seed)};
      msa::BatchSpec s;
      s.query_lens = {tokens};
      s.seq_lens = {tokens + 3000};
      const msa::BatchMetadata m = msa::build_metadata(s);
      Topk ids = random_topk(rng, m, 1, 16, false);
      if (shared)
        for (int t = 0; t < m.num_tokens; ++t)
          for (int k = 0; k < 16; ++k) ids.data[std::size_t(t) * 16 + std::size_t(k)] = 15 - k;
      ASSERT_TRUE(msa::cuda::k2q_sorts_in_chunks(m.num_tokens, 1, 16, rows_per_head(m))) << tokens << " tokens";
      expect_matches_cpu_plan(m, ids, 1);
    }
  }
}

TEST(CudaK2Q, EmptyStepGivesEmptyRows) {
  MSA_SKIP_WITHOUT_GPU();
  msa::BatchSpec s;
  s.query_lens = {0, 0};
  s.seq_lens = {300, 0};
  const msa::BatchMetadata m = msa::build_metadata(s);
  Topk ids;
  ids.topk = 16;
  msa::test::CheckBuffer check;
  const GpuPlan gpu = gpu_plan(m, ids, 2, check);
  ASSERT_EQ(gpu.offsets.size(), std::size_t(2 * 3 + 1));
  for (std::int64_t o : gpu.offsets) EXPECT_EQ(o, 0);
  EXPECT_EQ(check.message(), "");
}

// More requests than key_edges scans in one CTA (1,024): their first rows
// come from the separate scan, and the plan still equals the CPU plan. Their
// many rows over few edges take the device-wide sort.
TEST(CudaK2Q, ManyRequestsMatchCpuPlan) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(7150);
  MSA_TRACE_SEED(seed);
  std::mt19937 rng{std::uint32_t(seed)};
  msa::BatchSpec s;
  s.decode_threshold = 1;
  for (int i = 0; i < 1500; ++i) {
    s.query_lens.push_back(1);
    s.seq_lens.push_back(rng() % 9 == 0 ? 0 : 1 + int(rng() % 2500));
  }
  s.query_lens.push_back(300);
  s.seq_lens.push_back(2300);
  const msa::BatchMetadata m = msa::build_metadata(s);
  ASSERT_GT(m.num_requests, 1024);
  for (const int topk : {16, 40}) {
    EXPECT_FALSE(msa::cuda::k2q_sorts_in_chunks(m.num_tokens, 2, topk, rows_per_head(m)));
    const Topk ids = random_topk(rng, m, 2, topk, false);
    expect_matches_cpu_plan(m, ids, 2);
  }
}

// An ineligible id and a repeat at the end of their lists: the device plan is
// the CPU plan of the lists without them, and the ineligible id is recorded.
TEST(CudaK2Q, IneligibleAndRepeatedEntriesAreSkipped) {
  MSA_SKIP_WITHOUT_GPU();
  msa::BatchSpec s;
  s.query_lens = {1, 40};
  s.seq_lens = {900, 1000};
  s.decode_threshold = 1;
  const msa::BatchMetadata m = msa::build_metadata(s);
  std::mt19937 rng(7200);
  Topk ids = random_topk(rng, m, 2, 16, false);
  Topk clean = ids;
  auto last_valid = [&](Topk& t, int token, int head) {
    std::int32_t* row = t.data.data() + token * t.token_stride + head * t.head_stride;
    int k = 0;
    while (k < t.topk && row[k] >= 0) ++k;
    return std::pair<std::int32_t*, int>(row, k);
  };
  // Token 5 (request 1), head 1: its last entry becomes ineligible; token 9, head 0: a repeat.
  {
    auto [row, n] = last_valid(ids, 5, 1);
    ASSERT_GE(n, 2);
    row[n - 1] = m.token_position[5] / 128 + 1;
    last_valid(clean, 5, 1).first[n - 1] = -1;
  }
  {
    auto [row, n] = last_valid(ids, 9, 0);
    ASSERT_GE(n, 2);
    row[n - 1] = row[0];
    last_valid(clean, 9, 0).first[n - 1] = -1;
  }
  const msa::K2QPlan cpu = msa::build_k2q(m.view(), clean.view(clean.data.data()), 2);
  msa::test::CheckBuffer check;
  const GpuPlan gpu = gpu_plan(m, ids, 2, check);
  const std::string msg = check.message();
  std::printf("[k2q] recorded: %s\n", msg.c_str());
  EXPECT_NE(msg.find("topk[t=5, h=1"), std::string::npos) << msg;
  expect_same(cpu, gpu);
}

// Lists longer than a warp's 32 lanes (top-k 40): a repeat in the second 32
// of an entry in the first (skipped, the entries after it kept), a list whose
// valid prefix ends in the second 32, one that ends in the first with ids
// after its -1. Against the plan built here entry by entry (the CPU plan
// takes valid lists only).
TEST(CudaK2Q, ListsBeyondAWarpSkipRepeatsAndTheirEnd) {
  MSA_SKIP_WITHOUT_GPU();
  msa::BatchSpec s;
  s.query_lens = {30};
  s.seq_lens = {9000};  // positions 8970.. : 71 eligible blocks
  s.decode_threshold = 1;
  const msa::BatchMetadata m = msa::build_metadata(s);
  std::mt19937 rng(7300);
  const int topk = 40;
  Topk ids = random_topk(rng, m, 1, topk, false);
  std::int32_t* list2 = ids.data.data() + 2 * ids.token_stride;
  std::int32_t* list5 = ids.data.data() + 5 * ids.token_stride;
  std::int32_t* list11 = ids.data.data() + 11 * ids.token_stride;
  for (std::int32_t* l : {list2, list5, list11}) {
    std::iota(l, l + topk, 0);
    std::shuffle(l, l + topk, rng);
  }
  list2[35] = list2[3];
  list5[33] = -1;
  list11[7] = -1;
  // The plan entry by entry: tokens ascending, each list up to its first -1,
  // an id already placed for the list skipped.
  const std::int64_t rows = rows_per_head(m);
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> row_edges(static_cast<std::size_t>(rows));
  msa::K2QPlan want;
  want.counts.assign(std::size_t(m.num_tokens), 0);
  for (int t = 0; t < m.num_tokens; ++t) {
    const std::int32_t* l = ids.data.data() + t * ids.token_stride;
    std::vector<bool> seen(std::size_t(rows), false);
    for (int k = 0; k < topk && l[k] >= 0; ++k) {
      if (seen[std::size_t(l[k])]) continue;
      seen[std::size_t(l[k])] = true;
      row_edges[std::size_t(l[k])].push_back({t, k});
      ++want.counts[std::size_t(t)];
    }
  }
  want.offsets.push_back(0);
  for (const auto& r : row_edges) {
    for (const auto& [t, k] : r) {
      want.tokens.push_back(t);
      want.slots.push_back(k);
    }
    want.offsets.push_back(std::int64_t(want.tokens.size()));
  }
  msa::test::CheckBuffer check;
  const GpuPlan gpu = gpu_plan(m, ids, 1, check);
  EXPECT_EQ(check.message(), "");
  EXPECT_EQ(gpu.counts[2], topk - 1);
  EXPECT_EQ(gpu.counts[5], 33);
  EXPECT_EQ(gpu.counts[11], 7);
  expect_same(want, gpu);
}

TEST(CudaK2Q, WorkspaceAndArgumentErrorsNameTheArgument) {
  MSA_SKIP_WITHOUT_GPU();
  msa::BatchSpec s;
  s.query_lens = {4};
  s.seq_lens = {200};
  const msa::BatchMetadata m = msa::build_metadata(s);
  msa::test::DeviceStep step(m);
  DeviceBuffer<std::int32_t> ids(std::size_t(4 * 16));
  DeviceBuffer<std::int64_t> offsets(3);
  DeviceBuffer<std::int32_t> tokens(64), slots(64), counts(4);
  const msa::cuda::K2QDevicePlan plan{offsets.data(), tokens.data(), slots.data(), counts.data()};
  const msa::TopkView view = msa::TopkView::token_major(ids.data(), 1, 16);
  const std::size_t bytes = msa::cuda::k2q_workspace_bytes(4, 1, 1, 16, 2);
  DeviceBuffer<unsigned char> workspace(bytes);
  try {
    msa::cuda::build_k2q(step.view, view, 1, 2, plan, workspace.data(), bytes - 1, nullptr);
    FAIL() << "a short workspace must be rejected";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("workspace"), std::string::npos) << e.what();
  }
  try {
    msa::cuda::build_k2q(step.view, view, 0, 2, plan, workspace.data(), bytes, nullptr);
    FAIL() << "num_kv_heads 0 must be rejected";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_kv_heads"), std::string::npos) << e.what();
  }
}

}  // namespace
