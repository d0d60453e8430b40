// GPU tests of the sparse attention (src/cuda/attention): plan_attention +
// attend against the float64 oracle (dense masked attention over the keys the
// contract selects) and the CPU engine, for every KV dtype and layout, GQA
// groups, top-k widths, decode / verify / prefill / mixed batches, padding
// rows, bad indices, forced split-K factors and a replayed CUDA graph.
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
#include "cuda/attention/heuristics.hpp"
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
  bool small = false;                  // also run under the sanitizer
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

// ---- references ---------------------------------------------------------------

struct Result {
  std::vector<double> out;  // [num_tokens, num_q_heads, 128]
  std::vector<double> lse;  // [num_tokens, num_q_heads]
};

// The float64 oracle over the contract's key set: j / 128 among the row's
// usable ids (>= 0, <= p / 128, inside the table; repeats count once), j <= p.
// Reads the host cache through the cache reader; knows nothing of splits.
Result oracle(Workload& w, const BatchMetadata& meta, const std::vector<std::int32_t>& topk) {
  const int H = w.model().num_kv_heads, QH = w.model().num_q_heads, G = QH / H, K = w.model().topk;
  const AttentionArgs args = w.attention_args();
  const std::vector<double> q = msa::ref::read_query(args, meta.num_tokens);
  Result r;
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

Result read_result(const std::vector<std::uint8_t>& out, DType out_dtype, const std::vector<float>& lse) {
  Result r;
  r.out = msa::ref::read_array(out.data(), out_dtype, std::int64_t(out.size() / 2));
  r.lse.assign(lse.begin(), lse.end());
  return r;
}

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
  return read_result(w.out, w.out_dtype(), w.lse);
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
  msa::cuda::AttentionShape shape;

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
    shape.num_q_heads = w.model().num_q_heads;
    shape.num_kv_heads = w.model().num_kv_heads;
    shape.topk = w.model().topk;
    shape.q_dtype = args.q_dtype;
    shape.kv_dtype = args.cache.dtype;
    shape.out_dtype = args.out_dtype;
  }

  Result result() const { return read_result(out.download(), args.out_dtype, lse.download()); }
};

// Workspace and plan; forced split factors when given (else the heuristic's).
struct Planned {
  DeviceBuffer<std::uint8_t> workspace;
  msa::cuda::AttentionPlan plan;
};
Planned make_plan(const BatchMetadata& meta, const msa::cuda::AttentionShape& shape,
                  std::optional<msa::cuda::attention::Splits> forced = std::nullopt) {
  Planned p;
  if (!forced) {
    const std::size_t bytes = msa::cuda::attention_workspace_bytes(meta, shape);
    p.workspace = DeviceBuffer<std::uint8_t>(std::max<std::size_t>(bytes, 1));
    p.workspace.poison_nan();
    p.plan = msa::cuda::plan_attention(meta, shape, p.workspace.data(), bytes, nullptr);
    return p;
  }
  const auto layout = msa::cuda::attention::workspace_layout(meta.num_tokens, meta.num_decode_tokens,
                                                             shape.num_q_heads, *forced);
  p.workspace = DeviceBuffer<std::uint8_t>(std::max<std::size_t>(layout.bytes, 1));
  p.workspace.poison_nan();
  p.plan = msa::cuda::plan_attention(meta, shape, p.workspace.data(), p.workspace.bytes(), nullptr);
  p.plan.decode_splits = forced->decode;
  p.plan.prefill_splits = forced->prefill;
  p.plan.partial_out = reinterpret_cast<float*>(p.workspace.data() + layout.out_offset);
  p.plan.partial_lse = reinterpret_cast<float*>(p.workspace.data() + layout.lse_offset);
  return p;
}

// Checks got against want and prints one line for the device log.
void expect_close(const Result& got, const Result& want, const std::string& what, double tol = kOutTol) {
  const msa::ref::Comparison o = msa::ref::compare(got.out, want.out, what + " out");
  const msa::ref::Comparison l = msa::ref::compare_lse(got.lse, want.lse, what + " lse");
  std::printf("[attention] %-44s rel_frob %.3e  max_abs %.3e  lse_max_abs %.3e\n", what.c_str(),
              o.rel_frobenius, o.max_abs, l.max_abs);
  EXPECT_TRUE(o.rel_ok(tol)) << o.describe();
  EXPECT_TRUE(l.abs_ok(kLseTol)) << l.describe();
}

// Runs one case on the GPU and checks it against the oracle and the CPU engine.
void run_case(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "case " << c.name << ", seed " << c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto topk = random_topk(meta, c.kv_heads, c.topk, c.seed * 7919 + 1, c.shuffle_topk);

  DeviceInputs d(w, meta, topk);
  Planned p = make_plan(meta, d.shape);
  std::printf("[attention] %s: %d tokens (%d decode), splits decode %d prefill %d\n", c.name.c_str(),
              meta.num_tokens, meta.num_decode_tokens, p.plan.decode_splits, p.plan.prefill_splits);
  msa::test::CheckBuffer check;
  msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
  msa::test::device_sync();
  EXPECT_EQ(check.message(), "");
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

// Odd lengths: seq 1, 127, 129, 2047, 2049 for the decodes.
const std::vector<RequestShape> kOddDecodes = decodes({0, 126, 128, 2046, 2048});
const std::vector<RequestShape> kPrefills = {{129, 1000}, {64, 0}, {5, 300}};

std::vector<Case> all_cases() {
  std::vector<Case> v;
  auto add = [&](Case c) {
    c.seed = 1000 + v.size();
    v.push_back(std::move(c));
  };
  const auto mixed = kOddDecodes + kPrefills;
  const auto small_mixed = decodes({5, 300}) + std::vector<RequestShape>{{40, 200}};
  {
    Case c = named("bf16_decode_g16");
    c.requests = kOddDecodes;
    add(c);
  }
  {
    Case c = named("bf16_mixed_g16_small");
    c.requests = small_mixed;
    c.small = true;
    add(c);
  }
  {
    Case c = named("bf16_mixed_g8");
    c.q_heads = 8;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("fp16_mixed_g16");
    c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.requests = mixed;
    add(c);
  }
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (ScaleMode sm : {ScaleMode::per_tensor, ScaleMode::per_token_head}) {
      for (DType q : {DType::bf16, DType::fp16}) {
        Case c = named(std::string(msa::dtype_name(kv)) + (sm == ScaleMode::per_tensor ? "_tensor_" : "_token_") +
               msa::dtype_name(q));
        c.kv = kv, c.scales = sm, c.q = q;
        c.q_heads = sm == ScaleMode::per_tensor ? 16 : 8;
        c.kv_heads = sm == ScaleMode::per_tensor ? 1 : 2;
        c.requests = q == DType::bf16 ? mixed : small_mixed;
        c.small = q == DType::fp16;
        add(c);
      }
    }
  }
  for (DType q : {DType::bf16, DType::fp16}) {
    Case c = named(std::string("nvfp4_") + msa::dtype_name(q));
    c.kv = DType::nvfp4, c.q = q, c.scales = ScaleMode::none;
    c.q_heads = q == DType::bf16 ? 16 : 32, c.kv_heads = q == DType::bf16 ? 1 : 2;
    c.requests = q == DType::bf16 ? mixed : small_mixed;
    c.small = q == DType::fp16;
    add(c);
  }
  {
    Case c = named("nhd_bf16_g4");
    c.layout = Layout::nhd, c.q_heads = 8, c.kv_heads = 2;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("split_fp16_g1");
    c.layout = Layout::split, c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.q_heads = 4, c.kv_heads = 4;
    c.requests = small_mixed;
    c.small = true;
    add(c);
  }
  {
    Case c = named("page_stride_bf16");
    c.extra_page_stride = 64;  // elements: layer-outer packing
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("page_stride_e4m3_nhd_token");
    c.kv = DType::fp8_e4m3, c.layout = Layout::nhd, c.scales = ScaleMode::per_token_head;
    c.q_heads = 4, c.kv_heads = 2, c.extra_page_stride = 4096;
    c.requests = small_mixed;
    add(c);
  }
  {
    Case c = named("page_stride_nvfp4");
    c.kv = DType::nvfp4, c.scales = ScaleMode::none, c.extra_page_stride = 1024;  // bytes
    c.requests = small_mixed;
    add(c);
  }
  {
    Case c = named("gqa2_decode");
    c.q_heads = 8, c.kv_heads = 4;
    c.requests = kOddDecodes;
    add(c);
  }
  {
    Case c = named("gqa16_tp1_decode_batch8");
    c.q_heads = 64, c.kv_heads = 4;
    c.requests = decodes({100, 900, 2048, 5, 3000, 128, 127, 1500});
    add(c);
  }
  {
    Case c = named("topk1_mixed");
    c.topk = 1;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("topk64_long");
    c.topk = 64, c.q_heads = 8, c.kv_heads = 1;
    c.requests = decodes({9000, 2048, 40}) + std::vector<RequestShape>{{130, 8500}};
    add(c);
  }
  {
    Case c = named("shuffled_topk");
    c.shuffle_topk = true;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("verify2");
    c.decode_threshold = 2;
    c.requests = decodes({0, 127, 1000, 2047}, 2) + kPrefills;
    add(c);
  }
  {
    Case c = named("verify4_g8");
    c.decode_threshold = 4, c.q_heads = 16, c.kv_heads = 2;
    c.requests = decodes({3, 126, 129, 2045}, 4);
    add(c);
  }
  {
    Case c = named("prefill_cached_context");
    c.requests = {{300, 1700}, {257, 0}, {2, 2047}};
    add(c);
  }
  {
    Case c = named("fp8_query_bf16_cache");
    c.q = DType::fp8_e4m3, c.scales = ScaleMode::none;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("fp8_query_e4m3_cache");
    c.q = DType::fp8_e4m3, c.kv = DType::fp8_e4m3;
    c.requests = small_mixed;
    c.small = true;
    add(c);
  }
  return v;
}

class CudaAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttention, MatchesOracleAndCpu) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode() && !GetParam().small) GTEST_SKIP() << "large case";
  run_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttention, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Metadata of the workload's batch with some requests turned into padding
// (seq_len 0: their rows attend nothing).
BatchMetadata with_padding(const Workload& w, std::initializer_list<std::int32_t> padded) {
  msa::BatchSpec spec;
  for (std::int32_t r = 0; r < w.meta().num_requests; ++r) {
    spec.query_lens.push_back(w.meta().query_start[r + 1] - w.meta().query_start[r]);
    spec.seq_lens.push_back(w.meta().seq_lens[r]);
  }
  for (std::int32_t r : padded) spec.seq_lens[r] = 0;
  spec.decode_threshold = w.spec().decode_threshold;
  return msa::build_metadata(spec);
}

// Padding requests and all -1 top-k rows write 0 and lse -inf, never NaN; the
// other rows are unaffected.
TEST(CudaAttentionRows, PaddingAndEmptyRows) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("padding");
  c.seed = 77;
  c.q_heads = 8, c.kv_heads = 2;
  c.requests = decodes({10, 400, 900, 129}) + std::vector<RequestShape>{{20, 100}, {7, 0}};
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata meta = with_padding(w, {1, 5});
  auto topk = random_topk(meta, c.kv_heads, c.topk, c.seed, false);
  // Request 2's token, head 1: every entry -1.
  std::fill_n(topk.begin() + (std::size_t(meta.query_start[2]) * c.kv_heads + 1) * c.topk, c.topk, -1);
  // Padding rows carry garbage ids that must not be read.
  for (std::int32_t t = meta.query_start[5]; t < meta.query_start[6]; ++t)
    std::fill_n(topk.begin() + std::size_t(t) * c.kv_heads * c.topk, c.kv_heads * c.topk, 123456);

  for (bool forced : {false, true}) {
    DeviceInputs d(w, meta, topk);
    Planned p = forced ? make_plan(meta, d.shape, msa::cuda::attention::Splits{3, 2})
                       : make_plan(meta, d.shape);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    EXPECT_EQ(check.message(), "");
    const Result got = d.result();
    w.topk = topk;
    const Result want = oracle(w, meta, topk);
    expect_close(got, want, forced ? "padding rows, splits 3/2" : "padding rows");
    const int QH = c.q_heads, G = QH / c.kv_heads;
    for (int g = 0; g < G; ++g) {  // the all -1 row
      const std::size_t i = std::size_t(meta.query_start[2]) * QH + G + g;
      EXPECT_EQ(got.lse[i], -std::numeric_limits<double>::infinity());
      for (int e = 0; e < 128; ++e) ASSERT_EQ(got.out[i * 128 + e], 0.0);
    }
    for (std::int32_t t = meta.query_start[5]; t < meta.query_start[6]; ++t)
      for (int h = 0; h < QH; ++h) EXPECT_EQ(got.lse[std::size_t(t) * QH + h], -std::numeric_limits<double>::infinity());
  }
}

// Ineligible and repeated top-k ids and bad block-table entries are skipped and
// recorded; the rest of each row is still attended.
TEST(CudaAttentionRows, BadIndicesAreSkippedAndRecorded) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("bad_indices");
  c.seed = 99;
  c.requests = decodes({300, 1000, 2000});
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto good = random_topk(meta, c.kv_heads, c.topk, c.seed, false);

  {  // a top-k id beyond the query's own block, a huge one, a repeat
    auto topk = good;
    const int last = meta.token_position[1] / 128;
    topk[std::size_t(1) * c.topk + 2] = last + 3;
    topk[std::size_t(2) * c.topk + 0] = 1 << 30;
    topk[std::size_t(0) * c.topk + 1] = topk[0];
    DeviceInputs d(w, meta, topk);
    Planned p = make_plan(meta, d.shape);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    const std::string msg = check.message();
    std::printf("[attention] bad top-k recorded: %s\n", msg.c_str());
    EXPECT_NE(msg.find("topk[t="), std::string::npos) << msg;
    w.topk = topk;
    expect_close(d.result(), oracle(w, meta, topk), "bad top-k ids skipped");
  }
  {  // a block-table entry beyond the cache, read by request 1
    DeviceInputs d(w, meta, good);
    const std::int32_t bad_page = std::int32_t(w.num_pages + 7);
    const std::int32_t first = good[std::size_t(1) * c.topk];  // request 1's first selected block
    MSA_CUDA_CHECK(cudaMemcpy(d.table.data() + 1 * w.table_stride + first, &bad_page, sizeof(bad_page),
                              cudaMemcpyHostToDevice));
    Planned p = make_plan(meta, d.shape);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    const std::string msg = check.message();
    std::printf("[attention] bad block table recorded: %s\n", msg.c_str());
    EXPECT_NE(msg.find("block_table[r=1, b=" + std::to_string(first) + "] = " + std::to_string(bad_page)),
              std::string::npos)
        << msg;
    auto want_topk = good;  // the oracle skips that block for request 1's row
    std::replace(want_topk.begin() + c.topk, want_topk.begin() + 2 * c.topk, first, -1);
    w.topk = want_topk;
    expect_close(d.result(), oracle(w, meta, want_topk), "bad block-table entry skipped");
  }
}

// Every split-K factor gives the same answer (combine correctness, empty splits).
TEST(CudaAttentionRows, ForcedSplits) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("forced_splits");
  c.seed = 4242;
  c.q_heads = 16, c.kv_heads = 2;
  c.requests = decodes({0, 127, 700, 2048}) + std::vector<RequestShape>{{33, 600}, {3, 0}};
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto topk = random_topk(meta, c.kv_heads, c.topk, c.seed, false);
  w.topk = topk;
  const Result want = oracle(w, meta, topk);
  const std::vector<msa::cuda::attention::Splits> all = {{1, 1}, {2, 1}, {3, 2}, {5, 7}, {16, 16}, {1, 4}};
  for (const auto& s : all) {
    DeviceInputs d(w, meta, topk);
    Planned p = make_plan(meta, d.shape, s);
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr);
    msa::test::device_sync();
    expect_close(d.result(), want,
                 "splits decode " + std::to_string(s.decode) + " prefill " + std::to_string(s.prefill));
  }
}

// A decode step captured once in a CUDA graph and replayed with new top-k,
// sequence lengths, block tables and queries copied into the same buffers.
TEST(CudaAttentionGraph, ReplayWithNewInputs) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("graph");
  c.seed = 31337;
  c.q_heads = 32, c.kv_heads = 2;
  c.requests = decodes({300, 1000, 2000, 127});
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata meta0 = w.meta();
  auto topk = random_topk(meta0, c.kv_heads, c.topk, c.seed, false);
  DeviceInputs d(w, meta0, topk);
  Planned p = make_plan(meta0, d.shape);
  msa::test::CheckBuffer check;

  cudaStream_t stream;
  MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  msa::cuda::attend(p.plan, d.step.view, d.args, stream, check.get());
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  // Pages no request uses: targets for moved blocks.
  std::vector<bool> used(std::size_t(w.num_pages), false);
  for (std::int32_t x : w.block_table)
    if (x >= 0) used[std::size_t(x)] = true;
  std::vector<std::int32_t> spare;
  for (std::int32_t i = 0; i < std::int32_t(w.num_pages); ++i)
    if (!used[std::size_t(i)]) spare.push_back(i);
  const std::int64_t page_bytes = w.kv_view().page_stride * std::int64_t(msa::dtype_bytes(c.kv));

  std::mt19937_64 rng(c.seed);
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE(::testing::Message() << "replay " << replay);
    BatchMetadata meta = meta0;
    if (replay > 0) {
      // Shorter sequences (their keys are all in the cache).
      msa::BatchSpec spec;
      for (std::int32_t r = 0; r < meta0.num_requests; ++r) {
        spec.query_lens.push_back(1);
        spec.seq_lens.push_back(std::max(1, meta0.seq_lens[r] - int(rng() % 300)));
      }
      meta = msa::build_metadata(spec);
      MSA_CUDA_CHECK(cudaMemcpy(d.step.seq_lens.data(), meta.seq_lens.data(),
                                meta.seq_lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
      // Move one block of one request to a spare page (host and device copies).
      const std::int32_t r = std::int32_t(rng() % meta.num_requests);
      const std::int32_t b = std::int32_t(rng() % meta.num_blocks(r));
      const std::int32_t from = w.page(r, b), to = spare[std::size_t(replay) % spare.size()];
      std::memcpy(w.kv_bytes.data() + to * page_bytes, w.kv_bytes.data() + from * page_bytes, std::size_t(page_bytes));
      MSA_CUDA_CHECK(cudaMemcpy(d.kv.data() + to * page_bytes, d.kv.data() + from * page_bytes,
                                std::size_t(page_bytes), cudaMemcpyDeviceToDevice));
      w.block_table[std::size_t(r * w.table_stride + b)] = to;
      spare[std::size_t(replay) % spare.size()] = from;
      d.table.upload(w.block_table);
      // New queries and top-k.
      std::normal_distribution<float> normal;
      for (std::size_t i = 0; i + 1 < w.q.size(); i += 2) {
        const std::uint16_t x = msa::num::float_to_bf16(normal(rng));
        std::memcpy(w.q.data() + i, &x, 2);
      }
      d.q.upload(w.q);
      topk = random_topk(meta, c.kv_heads, c.topk, c.seed + 17 * replay, false);
      d.topk.upload(topk);
      d.out.poison_nan();
      d.lse.poison_nan();
    }
    MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(check.message(), "");
    const Result got = d.result();
    w.topk = topk;
    expect_close(got, oracle(w, meta, topk), "graph replay " + std::to_string(replay) + " vs oracle");
    if (const auto cpu = cpu_engine(w, meta, topk))
      expect_close(got, *cpu, "graph replay " + std::to_string(replay) + " vs cpu");
  }
  MSA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MSA_CUDA_CHECK(cudaGraphDestroy(graph));
  MSA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Host-side checks name the argument before anything launches.
TEST(CudaAttentionChecks, PlanAndRunMismatches) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("checks");
  c.requests = decodes({10, 20});
  Workload w = make_workload(c);
  const auto topk = random_topk(w.meta(), 1, 16, 1, false);
  DeviceInputs d(w, w.meta(), topk);
  msa::cuda::AttentionShape bad = d.shape;
  bad.num_q_heads = 17;
  EXPECT_THROW(msa::cuda::attention_workspace_bytes(w.meta(), bad), msa::Error);
  Planned p = make_plan(w.meta(), d.shape);
  if (p.plan.decode_splits > 1) {
    EXPECT_THROW(msa::cuda::plan_attention(w.meta(), d.shape, p.workspace.data(), 16, nullptr), msa::Error);
  }
  AttentionArgs args = d.args;
  args.num_q_heads = 8;
  EXPECT_THROW(msa::cuda::attend(p.plan, d.step.view, args, nullptr), msa::Error);
  args = d.args;
  args.cache.token_stride += 1;  // not 16-byte aligned
  EXPECT_THROW(msa::cuda::attend(p.plan, d.step.view, args, nullptr), msa::Error);
}

}  // namespace

// ---- throughput (numbers for the log; no assertions) ------------------------------

namespace {

// Unit-ish random bf16 values from a hash of (seed, index).
//   data: [n]
__global__ void fill_random_bf16(std::uint16_t* data, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (std::uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    const float u = float(x & 0xFFFFFF) * (1.0f / 16777216.0f) * 3.4f - 1.7f;
    data[i] = msa::num::float_to_bf16(u);
  }
}

struct PerfResult {
  double us = 0.0;       // per attend call
  double kv_bytes = 0.0; // K/V bytes of the selected blocks
  double flops = 0.0;    // 4 * 128 * visible keys per query head
};

// A synthetic step on a bf16 HND cache filled on the device: `seq_lens` per
// request, `query_lens` new tokens each, random valid top-k.
PerfResult time_attend(const std::vector<std::int32_t>& query_lens, const std::vector<std::int32_t>& seq_lens,
                       int q_heads, int kv_heads, int topk, int decode_threshold) {
  msa::BatchSpec spec{query_lens, seq_lens, decode_threshold};
  const BatchMetadata meta = msa::build_metadata(spec);
  std::int64_t pages = 0;
  std::int32_t max_blocks = 0;
  for (std::int32_t r = 0; r < meta.num_requests; ++r) {
    pages += meta.num_blocks(r);
    max_blocks = std::max(max_blocks, meta.num_blocks(r));
  }
  std::mt19937_64 rng(5);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::int32_t> table(std::size_t(meta.num_requests) * max_blocks, -1);
  for (std::int32_t r = 0, next = 0; r < meta.num_requests; ++r)
    for (std::int32_t b = 0; b < meta.num_blocks(r); ++b) table[std::size_t(r) * max_blocks + b] = perm[next++];
  const auto ids = random_topk(meta, kv_heads, topk, 9, false);

  const msa::KVCacheView host_view = msa::make_cache_view(DType::bf16, nullptr, pages, kv_heads, Layout::hnd);
  DeviceBuffer<std::uint16_t> cache(std::size_t(msa::cache_extent(host_view)));
  DeviceBuffer<std::uint16_t> q(std::size_t(meta.num_tokens) * q_heads * 128), out(q.size());
  DeviceBuffer<float> lse(std::size_t(meta.num_tokens) * q_heads);
  fill_random_bf16<<<1024, 256>>>(cache.data(), std::int64_t(cache.size()), 1);
  fill_random_bf16<<<1024, 256>>>(q.data(), std::int64_t(q.size()), 2);
  DeviceBuffer<std::int32_t> d_table(table), d_topk(ids);
  msa::test::DeviceStep step(meta);

  AttentionArgs a;
  a.q = q.data();
  a.out = out.data();
  a.lse = lse.data();
  a.num_q_heads = q_heads;
  a.topk = msa::TopkView::token_major(d_topk.data(), kv_heads, topk);
  a.cache = msa::make_cache_view(DType::bf16, cache.data(), pages, kv_heads, Layout::hnd);
  a.block_table = msa::BlockTable{d_table.data(), meta.num_requests, max_blocks, max_blocks};
  msa::cuda::AttentionShape shape{q_heads, kv_heads, topk, DType::bf16, DType::bf16, DType::bf16};
  Planned p = make_plan(meta, shape);

  PerfResult res;
  const int G = q_heads / kv_heads;
  for (std::int32_t t = 0; t < meta.num_tokens; ++t) {
    const std::int32_t pos = meta.token_position[t];
    for (int h = 0; h < kv_heads; ++h)
      for (int k = 0; k < topk; ++k) {
        const std::int32_t id = ids[(std::size_t(t) * kv_heads + h) * topk + k];
        if (id < 0) continue;
        res.kv_bytes += 2.0 * 128 * 128 * 2;
        res.flops += 4.0 * 128 * G * std::min(128, pos - id * 128 + 1);
      }
  }
  cudaEvent_t start, stop;
  MSA_CUDA_CHECK(cudaEventCreate(&start));
  MSA_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) msa::cuda::attend(p.plan, step.view, a, nullptr);
  const int iters = 20;
  MSA_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) msa::cuda::attend(p.plan, step.view, a, nullptr);
  MSA_CUDA_CHECK(cudaEventRecord(stop));
  MSA_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  MSA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  res.us = 1000.0 * ms / iters;
  std::printf("[attention-perf] tokens %d (decode %d) heads %d/%d topk %d splits %d/%d: %.1f us, "
              "%.0f GB/s of K/V, %.1f TFLOP/s\n",
              meta.num_tokens, meta.num_decode_tokens, q_heads, kv_heads, topk, p.plan.decode_splits,
              p.plan.prefill_splits, res.us, res.kv_bytes / res.us * 1e-3, res.flops / res.us * 1e-6);
  MSA_CUDA_CHECK(cudaEventDestroy(start));
  MSA_CUDA_CHECK(cudaEventDestroy(stop));
  return res;
}

TEST(CudaAttentionPerf, Throughput) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode()) GTEST_SKIP() << "timing only";
  {  // device-to-device copy bandwidth, the decode reference
    const std::size_t bytes = std::size_t(1) << 30;
    DeviceBuffer<std::uint8_t> a(bytes), b(bytes);
    MSA_CUDA_CHECK(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
    cudaEvent_t start, stop;
    MSA_CUDA_CHECK(cudaEventCreate(&start));
    MSA_CUDA_CHECK(cudaEventCreate(&stop));
    MSA_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < 5; ++i) MSA_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice));
    MSA_CUDA_CHECK(cudaEventRecord(stop));
    MSA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    MSA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("[attention-perf] copy: %.0f GB/s read, %.0f GB/s read+write\n", 5.0 * bytes / ms * 1e-6,
                10.0 * bytes / ms * 1e-6);
  }
  for (int batch : {1, 8, 32, 64, 128}) {
    time_attend(std::vector<std::int32_t>(std::size_t(batch), 1), std::vector<std::int32_t>(std::size_t(batch), 16384),
                16, 1, 16, 1);
  }
  time_attend(std::vector<std::int32_t>(32, 1), std::vector<std::int32_t>(32, 16384), 64, 4, 16, 1);
  time_attend(std::vector<std::int32_t>(64, 4), std::vector<std::int32_t>(64, 16384), 16, 1, 16, 4);
  time_attend({8192}, {8192}, 16, 1, 16, 1);
  time_attend({4096, 4096}, {32768, 8192}, 16, 1, 16, 1);
}

}  // namespace
