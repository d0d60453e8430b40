// Helpers of the GPU attention tests (test_cuda_attention.cu): test cases over
// the workload synthesis, random top-k lists, the float64 oracle over the
// contract's key set, the CPU engine as a second reference, device copies of a
// workload and plans with forced split factors. Test-only; included by one file.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache_reader.hpp"
#include "compare.hpp"
#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/widen/choice.hpp"
#include "gpu_test_util.hpp"
#include "msa/cpu.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "oracle.hpp"
#include "workload.hpp"

namespace {

using msa::AttentionArgs;
using msa::BatchMetadata;
using msa::DType;
using msa::Layout;
using msa::RequestShape;
using msa::ScaleMode;
using msa::Workload;
using msa::test::DeviceBuffer;

constexpr double kOutTol = 1e-2;  // rel Frobenius (contract 9; no fp8 arithmetic in the kernel)
constexpr double kLseTol = 1e-3;  // absolute

// ---- one test case -------------------------------------------------------------

struct Case {
  std::string name;
  int q_heads = 16, kv_heads = 1, topk = 16;
  DType kv = DType::bf16;
  Layout layout = Layout::hnd;
  ScaleMode scales = ScaleMode::per_tensor;
  DType q = DType::bf16;
  std::vector<RequestShape> requests;
  int decode_threshold = 1;
  std::int64_t extra_page_stride = 0;  // elements (bytes for nvfp4) beyond a compact page
  bool shuffle_topk = false;           // valid entries in random order
  bool clustered = false;              // neighbouring tokens share most blocks (clustered_topk)
  bool force_tiles = false;            // prefill rows through the token-tile kernel (no prefill split)
  bool small = false;                  // also run under the sanitizer
  float score_gain = 1.0f;             // the softmax scale times this: sharp rows, whose max jumps between blocks
  int q_exponent = 0;                  // bf16 queries times 2^q_exponent, the softmax scale divided by it (same scores)
  int expect_key_major = -1;           // 1: the device must run key-major, 0: the token tiles, -1: either
  std::int64_t widen_bytes = -1;       // AttentionTuning::widen_bytes (fp8 / nvfp4 tiles)
  // Set: widen_bytes is room for the pages the step selects plus this many
  // (0: exactly enough, -1: one page short), and the plan must be gated.
  std::optional<int> widen_spare_pages;
  std::uint64_t seed = 1;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Case named(std::string name) {
  Case c;
  c.name = std::move(name);
  return c;
}

msa::WorkloadSpec spec_of(const Case& c) {
  msa::WorkloadSpec s;
  s.model.num_q_heads = c.q_heads;
  s.model.num_kv_heads = c.kv_heads;
  s.model.topk = c.topk;
  s.kv_dtype = c.kv;
  s.layout = c.layout;
  s.fp8_scales = c.scales;
  s.q_dtype = c.q;
  s.requests = c.requests;
  s.decode_threshold = c.decode_threshold;
  s.seed = c.seed;
  s.model.softmax_scale *= c.score_gain;
  s.model.softmax_scale = std::ldexp(s.model.softmax_scale, -c.q_exponent);
  if (c.extra_page_stride > 0) {
    const std::int64_t compact = c.kv == DType::nvfp4 ? 2 * c.kv_heads * msa::nvfp4::kSlotBytes
                                                      : std::int64_t(c.kv_heads) * 128 * 256;
    s.page_stride = compact + c.extra_page_stride;
  }
  return s;
}

// A workload whose step tokens are already in the cache (attention runs after insert).
Workload make_workload(const Case& c) {
  Workload w(spec_of(c));
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), w.cpu_options());
  if (c.q_exponent != 0) {  // exact: a power of two, within bf16's range
    EXPECT_EQ(c.q, DType::bf16) << "q_exponent scales bf16 queries";
    for (std::size_t i = 0; i + 1 < w.q.size(); i += 2) {
      std::uint16_t h = 0;
      std::memcpy(&h, &w.q[i], 2);
      h = msa::num::float_to_bf16(std::ldexp(msa::num::bf16_to_float(h), c.q_exponent));
      std::memcpy(&w.q[i], &h, 2);
    }
  }
  return w;
}

// Random valid top-k rows: the query's own block, then distinct random earlier
// blocks, min(topk, p/128 + 1) in all, ascending (or shuffled), then -1.
//   returns [num_tokens, num_kv_heads, topk]
std::vector<std::int32_t> random_topk(const BatchMetadata& meta, int num_kv_heads, int topk,
                                      std::uint64_t seed, bool shuffle) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> out(std::size_t(meta.num_tokens) * num_kv_heads * topk, -1);
  std::vector<std::int32_t> pool;
  for (std::int32_t t = 0; t < meta.num_tokens; ++t) {
    const std::int32_t p = meta.token_position[t];
    if (p < 0) continue;
    const std::int32_t last = p / 128;
    const int n = std::min(topk, last + 1);
    for (int h = 0; h < num_kv_heads; ++h) {
      pool.resize(std::size_t(last));
      std::iota(pool.begin(), pool.end(), 0);
      for (int i = 0; i < n - 1; ++i) {
        std::uniform_int_distribution<std::size_t> pick(std::size_t(i), pool.size() - 1);
        std::swap(pool[std::size_t(i)], pool[pick(rng)]);
      }
      std::vector<std::int32_t> ids(pool.begin(), pool.begin() + (n - 1));
      ids.push_back(last);
      std::sort(ids.begin(), ids.end());
      if (shuffle) std::shuffle(ids.begin(), ids.end(), rng);
      std::copy(ids.begin(), ids.end(), out.begin() + (std::size_t(t) * num_kv_heads + h) * topk);
    }
  }
  return out;
}

// Clustered top-k rows, as real indexers produce them: the tokens of a request
// (per KV head) draw from a pool of blocks that drifts every 32 tokens (a
// quarter replaced), so neighbouring tokens share most of their selections.
// Each row: the query's own block plus min(topk, p/128 + 1) - 1 distinct earlier
// blocks (pool first, then random ones), ascending or shuffled, then -1. With
// `repeats`, some rows repeat an entry in place of a trailing -1 (the GPU
// skips the repeat; the CPU engine rejects it).
//   returns [num_tokens, num_kv_heads, topk]
std::vector<std::int32_t> clustered_topk(const BatchMetadata& meta, int num_kv_heads, int topk,
                                         std::uint64_t seed, bool shuffle, bool repeats = false) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> out(std::size_t(meta.num_tokens) * num_kv_heads * topk, -1);
  std::vector<std::int32_t> pool, row;
  std::vector<char> taken;
  for (std::int32_t r = 0; r < meta.num_requests; ++r) {
    for (int h = 0; h < num_kv_heads; ++h) {
      pool.clear();
      for (std::int32_t t = meta.query_start[r]; t < meta.query_start[r + 1]; ++t) {
        const std::int32_t p = meta.token_position[t];
        if (p < 0) continue;
        const std::int32_t last = p / 128;
        const int n = std::min(topk, last + 1);
        if ((t - meta.query_start[r]) % 32 == 0 || pool.empty()) {
          std::shuffle(pool.begin(), pool.end(), rng);
          pool.resize(pool.size() * 3 / 4);
          const std::size_t want = std::min<std::size_t>(std::size_t(last), std::size_t(topk + topk / 2));
          taken.assign(std::size_t(last) + 1, 0);
          for (std::int32_t b : pool) taken[std::size_t(b)] = 1;
          while (pool.size() < want) {
            const auto b = std::int32_t(rng() % std::uint64_t(last));
            if (!taken[std::size_t(b)]) taken[std::size_t(b)] = 1, pool.push_back(b);
          }
        }
        row.assign(1, last);
        taken.assign(std::size_t(last) + 1, 0);
        taken[std::size_t(last)] = 1;
        std::shuffle(pool.begin(), pool.end(), rng);
        for (std::int32_t b : pool)
          if (int(row.size()) < n && !taken[std::size_t(b)]) taken[std::size_t(b)] = 1, row.push_back(b);
        while (int(row.size()) < n) {
          const auto b = std::int32_t(rng() % std::uint64_t(last));
          if (!taken[std::size_t(b)]) taken[std::size_t(b)] = 1, row.push_back(b);
        }
        std::sort(row.begin(), row.end());
        if (shuffle) std::shuffle(row.begin(), row.end(), rng);
        if (repeats && n < topk && rng() % 3 == 0) row.push_back(row[rng() % row.size()]);
        std::copy(row.begin(), row.end(), out.begin() + (std::size_t(t) * num_kv_heads + h) * topk);
      }
    }
  }
  return out;
}

// The top-k rows of a case.
std::vector<std::int32_t> case_topk(const Case& c, const BatchMetadata& meta) {
  const std::uint64_t seed = c.seed * 7919 + 1;
  return c.clustered ? clustered_topk(meta, c.kv_heads, c.topk, seed, c.shuffle_topk)
                     : random_topk(meta, c.kv_heads, c.topk, seed, c.shuffle_topk);
}

// ---- references ---------------------------------------------------------------

struct Result {
  std::vector<double> out;  // [num_tokens, num_q_heads, 128]
  std::vector<double> lse;  // [num_tokens, num_q_heads]
  std::int64_t row_len = 0;  // num_q_heads * 128: one token's output row
};

// The float64 oracle over the contract's key set: j / 128 among the row's
// usable ids (>= 0, <= p / 128, inside the table; repeats count once), j <= p.
// Reads the host cache through the cache reader; knows nothing of splits.
Result oracle(Workload& w, const BatchMetadata& meta, const std::vector<std::int32_t>& topk) {
  const int H = w.model().num_kv_heads, QH = w.model().num_q_heads, G = QH / H, K = w.model().topk;
  const AttentionArgs args = w.attention_args();
  const std::vector<double> q = msa::ref::read_query(args, meta.num_tokens);
  Result r;
  r.row_len = std::int64_t(QH) * 128;
  r.out.assign(std::size_t(meta.num_tokens) * QH * 128, 0.0);
  r.lse.assign(std::size_t(meta.num_tokens) * QH, -std::numeric_limits<double>::infinity());
  for (std::int32_t req = 0; req < meta.num_requests; ++req) {
    const std::int32_t t0 = meta.query_start[req], t1 = meta.query_start[req + 1];
    const std::int32_t seq = meta.seq_lens[req];
    if (t0 == t1 || seq <= 0) continue;
    const std::int64_t rows = std::int64_t(t1 - t0) * G;
    std::vector<double> qr(std::size_t(rows) * 128), o(std::size_t(rows) * 128), l(static_cast<std::size_t>(rows));
    std::vector<std::uint8_t> mask(std::size_t(rows) * seq);
    for (int h = 0; h < H; ++h) {
      const msa::ref::HeadKV kv = msa::ref::read_kv(args.cache, args.block_table, req, h, seq);
      std::fill(mask.begin(), mask.end(), std::uint8_t{0});
      for (std::int32_t t = t0; t < t1; ++t) {
        const std::int32_t p = meta.token_position[t];
        const std::int32_t* row = topk.data() + (std::size_t(t) * H + h) * K;
        for (int k = 0; k < K; ++k) {
          const std::int32_t id = row[k];
          if (id < 0 || id > p / 128 || id >= args.block_table.max_blocks) continue;
          for (std::int32_t j = id * 128; j < std::min(id * 128 + 128, p + 1); ++j)
            for (int g = 0; g < G; ++g) mask[(std::size_t(t - t0) * G + g) * seq + j] = 1;
        }
        for (int g = 0; g < G; ++g)
          std::copy_n(q.begin() + (std::size_t(t) * QH + h * G + g) * 128, 128,
                      qr.begin() + (std::size_t(t - t0) * G + g) * 128);
      }
      msa::ref::masked_attention(qr.data(), kv.k.data(), kv.v.data(), mask.data(), rows, seq,
                                 args.softmax_scale, o.data(), l.data());
      for (std::int32_t t = t0; t < t1; ++t)
        for (int g = 0; g < G; ++g) {
          const std::size_t src = std::size_t(t - t0) * G + g, dst = std::size_t(t) * QH + h * G + g;
          std::copy_n(o.begin() + src * 128, 128, r.out.begin() + dst * 128);
          r.lse[dst] = l[src];
        }
    }
  }
  return r;
}

Result read_result(const std::vector<std::uint8_t>& out, DType out_dtype, const std::vector<float>& lse,
                   int num_q_heads) {
  Result r;
  r.row_len = std::int64_t(num_q_heads) * 128;
  r.out = msa::ref::read_array(out.data(), out_dtype, std::int64_t(out.size() / 2));
  r.lse.assign(lse.begin(), lse.end());
  return r;
}

// Case c's workload with random top-k lists (seed c.seed) and the oracle's
// answer, for tests that attend it under several plans.
struct OracleStep {
  Workload w;
  std::vector<std::int32_t> topk;
  Result want;
  explicit OracleStep(const Case& c)
      : w(make_workload(c)), topk(random_topk(w.meta(), c.kv_heads, c.topk, c.seed, false)) {
    w.topk = topk;
    want = oracle(w, w.meta(), topk);
  }
};

// The CPU engine on the same inputs; nothing while it is still a stub.
std::optional<Result> cpu_engine(Workload& w, const BatchMetadata& meta,
                                 const std::vector<std::int32_t>& topk) {
  w.poison_outputs();
  w.topk = topk;
  try {
    msa::cpu::attend(meta.view(), w.attention_args(), w.cpu_options());
  } catch (const msa::Error& e) {
    if (std::string(e.what()).find("not implemented") != std::string::npos) return std::nullopt;
    throw;
  }
  return read_result(w.out, w.out_dtype(), w.lse, w.model().num_q_heads);
}


// ---- the GPU run ----------------------------------------------------------------

// Device copies of a workload's inputs and poisoned outputs.
struct DeviceInputs {
  DeviceBuffer<std::uint8_t> kv;
  DeviceBuffer<float> k_scales, v_scales;
  DeviceBuffer<std::int32_t> table, topk;
  DeviceBuffer<std::uint8_t> q, out;
  DeviceBuffer<float> lse;
  msa::test::DeviceStep step;
  AttentionArgs args;
  msa::cuda::AttentionTuning tuning;

  DeviceInputs(Workload& w, const BatchMetadata& meta, const std::vector<std::int32_t>& topk_rows)
      : kv(w.kv_bytes),
        k_scales(w.k_scales),
        v_scales(w.v_scales),
        table(w.block_table),
        topk(topk_rows),
        q(w.q),
        out(w.out.size()),
        lse(std::size_t(meta.num_tokens) * w.model().num_q_heads),
        step(meta) {
    out.poison_nan();
    lse.poison_nan();
    args = w.attention_args();
    args.q = q.data();
    args.out = out.data();
    args.lse = lse.data();
    args.topk.data = topk.data();
    args.cache = w.kv_view_at(kv.data(), k_scales.data(), v_scales.data());
    args.block_table = w.table_at(table.data());
  }

  Result result() const { return read_result(out.download(), args.out_dtype, lse.download(), args.num_q_heads); }
};

// Workspace and plan of the problem `args` states; forced split factors when
// given (else the heuristic's), through the tuning.
struct Planned {
  DeviceBuffer<std::uint8_t> workspace;
  msa::cuda::AttentionPlan plan;
};
Planned make_plan(const BatchMetadata& meta, const AttentionArgs& args, msa::cuda::AttentionTuning tuning = {},
                  std::optional<msa::cuda::attention::Splits> forced = std::nullopt) {
  if (forced) {
    tuning.decode_splits = forced->decode;
    tuning.prefill_splits = forced->prefill;
  }
  Planned p;
  const std::size_t bytes = msa::cuda::attention_workspace_bytes(meta, args, tuning);
  p.workspace = DeviceBuffer<std::uint8_t>(std::max<std::size_t>(bytes, 1));
  p.workspace.poison_nan();
  p.plan = msa::cuda::plan_attention(meta, args, {p.workspace.data(), bytes}, nullptr, tuning);
  return p;
}

// Plans whose prefill rows run as token tiles: the heuristic's decode split and
// no prefill split. Fails the test if the shape does not allow tiles.
Planned make_tiles_plan(const BatchMetadata& meta, const AttentionArgs& args,
                        const msa::cuda::AttentionTuning& tuning = {}) {
  namespace att = msa::cuda::attention;
  const int group = args.num_q_heads / args.cache.num_kv_heads;
  EXPECT_TRUE(att::use_token_tiles(group, args.topk.topk, 1))
      << "group " << group << " topk " << args.topk.topk << " cannot run as token tiles";
  const att::Splits heuristic = att::choose_step_splits(meta.num_tokens, meta.num_decode_tokens,
                                                        args.cache.num_kv_heads, args.topk.topk, 132);
  return make_plan(meta, args, tuning, att::Splits{heuristic.decode, 1});
}

// Checks got against want, each token's output row within tol, and prints one
// line for the device log.
void expect_close(const Result& got, const Result& want, const std::string& what, double tol = kOutTol) {
  const msa::ref::Comparison o = msa::ref::compare_rows(got.out, want.out, want.row_len, what + " out");
  const msa::ref::Comparison l = msa::ref::compare_lse(got.lse, want.lse, what + " lse");
  std::printf("[attention] %-44s rel_frob %.3e  max_abs %.3e  lse_max_abs %.3e\n", what.c_str(),
              o.rel_frobenius, o.max_abs, l.max_abs);
  EXPECT_TRUE(o.rel_ok(tol)) << o.describe();
  EXPECT_TRUE(l.abs_ok(kLseTol)) << l.describe();
}

// The step ran key-major (want) or the token tiles: its plan reserved the
// key-major data and the device's choice (the key-major gate in the
// workspace) let the kernel run, or not.
void expect_ran_key_major(const msa::cuda::AttentionPlan& plan, bool want = true) {
  ASSERT_EQ(plan.schedule.prefill, msa::cuda::PrefillKernel::key_major) << "the plan does not allow key-major";
  std::int64_t stats[4] = {};
  MSA_CUDA_CHECK(cudaMemcpy(stats, static_cast<unsigned char*>(plan.workspace.data) + plan.schedule.map.km_stats,
                            sizeof(stats), cudaMemcpyDeviceToHost));
  std::printf("[attention] key-major: %lld items, %lld tile rounds, gate %lld\n", static_cast<long long>(stats[0]),
              static_cast<long long>(stats[1]), static_cast<long long>(stats[2]));
  EXPECT_EQ(stats[2] > 0, want) << (want ? "the device did not run key-major" : "the device ran key-major");
}

// What the step's prefill tokens select and may read (valid ids, eligible
// for the token's position): distinct (request, block) pairs, and distinct
// (request, KV head, block) triples.
//   topk: [num_tokens, num_kv_heads, topk]
struct Selected {
  std::int64_t pairs = 0, triples = 0;
};
Selected selected_blocks(const BatchMetadata& meta, const std::vector<std::int32_t>& topk, int kv_heads,
                         int topk_count) {
  std::vector<std::int64_t> pairs, triples;
  for (std::int32_t t = meta.num_decode_tokens; t < meta.num_tokens; ++t) {
    const std::int32_t pos = meta.token_position[std::size_t(t)];
    if (pos < 0) continue;
    const std::int64_t r = meta.token_request[std::size_t(t)];
    for (int h = 0; h < kv_heads; ++h) {
      for (int k = 0; k < topk_count; ++k) {
        const std::int32_t id = topk[(std::size_t(t) * kv_heads + h) * topk_count + k];
        if (id < 0 || id > pos / 128) continue;
        pairs.push_back((r << 32) + id);
        triples.push_back(((r * kv_heads + h) << 32) + id);
      }
    }
  }
  auto distinct = [](std::vector<std::int64_t>& v) {
    std::sort(v.begin(), v.end());
    return std::int64_t(std::unique(v.begin(), v.end()) - v.begin());
  };
  return {distinct(pairs), distinct(triples)};
}

// A step that widened its blocks ahead: the device claimed one page per
// selected (request, block) and one work item per selected (request, KV
// head, block); returns whether the widened tiles ran (a gated step's gate,
// from the workspace; an ungated step always runs them).
bool expect_widened(const msa::cuda::AttentionPlan& plan, const BatchMetadata& meta,
                    const std::vector<std::int32_t>& topk, int kv_heads, int topk_count) {
  const msa::cuda::AttentionSchedule& s = plan.schedule;
  std::int32_t counters[2] = {};
  std::int64_t gates[2] = {};
  const auto* base = static_cast<const unsigned char*>(plan.workspace.data);
  MSA_CUDA_CHECK(cudaMemcpy(counters, base + s.map.widen_counters, sizeof(counters), cudaMemcpyDeviceToHost));
  if (s.widen_gated) MSA_CUDA_CHECK(cudaMemcpy(gates, base + s.map.widen_gates, sizeof(gates), cudaMemcpyDeviceToHost));
  const Selected want = selected_blocks(meta, topk, kv_heads, topk_count);
  const bool ran = !s.widen_gated || gates[0] > 0;
  std::printf("[attention] widened: %d pages claimed (%d head tiles) of room for %lld (%s), %s\n", counters[0] + 1,
              counters[1] + 1, static_cast<long long>(s.widen_pages), s.widen_gated ? "gated" : "surely fits",
              ran ? "the widened tiles ran" : "widened on the fly");
  EXPECT_EQ(counters[0] + 1, want.pairs) << "pages claimed";
  EXPECT_EQ(counters[1] + 1, want.triples) << "head tiles claimed";
  EXPECT_EQ(ran, want.pairs <= s.widen_pages);
  if (s.widen_gated) EXPECT_EQ(gates[0] > 0, gates[1] == 0) << "exactly one kernel runs";
  return ran;
}

// Runs one case on the GPU (under `tuning`) and checks it against the oracle
// and the CPU engine.
void run_case(const Case& c, const msa::cuda::AttentionTuning& tuning = {}) {
  SCOPED_TRACE(::testing::Message() << "case " << c.name << ", seed " << c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto topk = case_topk(c, meta);

  DeviceInputs d(w, meta, topk);
  d.tuning = tuning;
  d.tuning.widen_bytes = c.widen_bytes;
  if (c.widen_spare_pages) {
    const std::int64_t pages = selected_blocks(meta, topk, c.kv_heads, c.topk).pairs + *c.widen_spare_pages;
    ASSERT_GT(pages, 0) << "a step that selects too few blocks to test";
    namespace att = msa::cuda::attention;
    const bool token_scales = msa::cuda::AttentionProblem::of(d.args).kv_token_scales;
    d.tuning.widen_bytes = pages * c.kv_heads * att::widen_head_bytes(att::widen_scales(c.kv, token_scales));
  }
  Planned p = c.force_tiles ? make_tiles_plan(meta, d.args, d.tuning) : make_plan(meta, d.args, d.tuning);
  const msa::cuda::AttentionSchedule& s = p.plan.schedule;
  if (c.widen_spare_pages) {
    ASSERT_GT(s.widen_pages, 0) << "the plan does not widen";
    if (*c.widen_spare_pages < 0) EXPECT_TRUE(s.widen_gated) << "a room one page short must be gated";
  }
  std::printf("[attention] %s: %d tokens (%d decode), splits decode %d prefill %d, prefill kernel %d, tiles of %d "
              "tokens\n",
              c.name.c_str(), meta.num_tokens, meta.num_decode_tokens, s.decode_splits, s.prefill_splits,
              static_cast<int>(s.prefill), s.tile_tokens);
  msa::test::CheckBuffer check;
  msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
  msa::test::device_sync();
  EXPECT_EQ(check.message(), "");
  if (c.expect_key_major >= 0) expect_ran_key_major(p.plan, c.expect_key_major == 1);
  if (s.widen_pages > 0) expect_widened(p.plan, meta, topk, c.kv_heads, c.topk);
  const Result got = d.result();

  w.topk = topk;
  expect_close(got, oracle(w, meta, topk), c.name + " vs oracle");
  if (const auto cpu = cpu_engine(w, meta, topk)) expect_close(got, *cpu, c.name + " vs cpu");
}

// ---- the case table -----------------------------------------------------------

std::vector<RequestShape> decodes(std::initializer_list<std::int32_t> contexts, int qlen = 1) {
  std::vector<RequestShape> r;
  for (std::int32_t c : contexts) r.push_back({qlen, c});
  return r;
}
std::vector<RequestShape> operator+(std::vector<RequestShape> a, const std::vector<RequestShape>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}


}  // namespace
