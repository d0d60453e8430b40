// GPU tests of the sparse attention (src/cuda/attention): plan_attention +
// attend against the float64 oracle (dense masked attention over the keys the
// contract selects) and the CPU engine, for every KV dtype and layout, GQA
// groups, top-k widths, decode / verify / prefill / mixed batches, padding
// rows, bad indices, forced split-K factors and a replayed CUDA graph.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_perf.cuh"
#include "attention_test_support.hpp"
#include "attention_key_major_tests.hpp"
#include "attention_tile_tests.hpp"

namespace {

// ---- the case table -----------------------------------------------------------

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
  // bf16 queries far beyond fp16's range and far below it: the fp8 / nvfp4 row
  // kernels run on fp16 MMA with each query row scaled by a power of two.
  for (DType kv : {DType::fp8_e4m3, DType::nvfp4}) {
    for (int q_exponent : {20, -40}) {
      Case c = named(std::string(msa::dtype_name(kv)) + "_bf16_query_times_2_" +
                     (q_exponent < 0 ? "minus_" : "") + std::to_string(std::abs(q_exponent)));
      c.kv = kv, c.q_exponent = q_exponent;
      c.scales = kv == DType::nvfp4 ? ScaleMode::none : ScaleMode::per_tensor;
      c.requests = small_mixed;
      c.small = true;
      add(c);
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

  for (int mode : {0, 1, 2}) {  // the heuristic's plan, forced splits, prefill as token tiles
    const bool forced = mode == 1;
    DeviceInputs d(w, meta, topk);
    Planned p = mode == 1   ? make_plan(meta, d.args, {}, msa::cuda::attention::Splits{3, 2})
                : mode == 2 ? make_tiles_plan(meta, d.args)
                            : make_plan(meta, d.args, d.tuning);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    EXPECT_EQ(check.message(), "");
    const Result got = d.result();
    w.topk = topk;
    const Result want = oracle(w, meta, topk);
    expect_close(got, want, forced ? "padding rows, splits 3/2" : mode == 2 ? "padding rows, tiles" : "padding rows");
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
    Planned p = make_plan(meta, d.args, d.tuning);
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
    Planned p = make_plan(meta, d.args, d.tuning);
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
  OracleStep ref(c);
  const BatchMetadata& meta = ref.w.meta();
  const std::vector<msa::cuda::attention::Splits> all = {{1, 1}, {2, 1}, {3, 2}, {5, 7}, {16, 16}, {1, 4}};
  for (const auto& s : all) {
    DeviceInputs d(ref.w, meta, ref.topk);
    Planned p = make_plan(meta, d.args, {}, s);
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr);
    msa::test::device_sync();
    expect_close(d.result(), ref.want,
                 "splits decode " + std::to_string(s.decode) + " prefill " + std::to_string(s.prefill));
  }
}

// The public split knob (AttentionTuning::decode_splits): the plan takes it,
// its workspace holds the split partials, the result still matches the oracle;
// a value past kMaxSplits is refused naming the field.
// fp8 merges its cluster splits by pushes with per-tensor scales and by pulls
// with per-token ones (their scales take the receive area).
TEST(CudaAttentionRows, ShapeDecodeSplits) {
  MSA_SKIP_WITHOUT_GPU();
  for (const auto& [kv, token_scales] : std::vector<std::pair<DType, bool>>{
           {DType::bf16, false}, {DType::fp8_e4m3, false}, {DType::fp8_e4m3, true}, {DType::nvfp4, false}}) {
    Case c = named(std::string("shape_decode_splits_") + msa::dtype_name(kv) + (token_scales ? "_token_scales" : ""));
    c.seed = 9191;
    c.kv = kv;
    if (token_scales) c.scales = ScaleMode::per_token_head;
    c.q_heads = 16, c.kv_heads = 1;
    c.requests = decodes({0, 129, 900, 3000, 5000});
    MSA_TRACE_SEED(c.seed);
    OracleStep ref(c);
    const BatchMetadata& meta = ref.w.meta();
    // 1-8 merge in clusters of that size (5 rows: they fit), 9 and 16 through the workspace.
    for (const int splits : {0, 1, 3, 4, 6, 8, 9, 16}) {
      DeviceInputs d(ref.w, meta, ref.topk);
      d.tuning.decode_splits = splits;
      Planned p = make_plan(meta, d.args, d.tuning);
      if (splits > 0) EXPECT_EQ(p.plan.schedule.decode_splits, splits);
      msa::cuda::attend(p.plan, d.step.view, d.args, nullptr);
      msa::test::device_sync();
      expect_close(d.result(), ref.want,
                   c.name + " decode_splits " + std::to_string(splits) + " (plan " +
                       std::to_string(p.plan.schedule.decode_splits) + ")");
    }
    if (kv != DType::bf16) continue;
    DeviceInputs d(ref.w, meta, ref.topk);
    d.tuning.decode_splits = 17;
    try {
      (void)msa::cuda::attention_workspace_bytes(meta, d.args, d.tuning);
      ADD_FAILURE() << "decode_splits = 17 was accepted";
    } catch (const msa::Error& e) {
      EXPECT_NE(std::string(e.what()).find("decode_splits = 17"), std::string::npos) << e.what();
    }
  }
}

// Split token tiles (AttentionTuning::tile_splits): every factor gives the
// oracle's answer on a mixed step (decode rows, prefill chunks of odd lengths
// on cached contexts, a chunk shorter than a tile), at G = 16 and G = 8, bf16
// and fp16; a value past kMaxTileSplits is refused naming the field.
TEST(CudaAttentionTiles, ShapeTileSplits) {
  MSA_SKIP_WITHOUT_GPU();
  namespace att = msa::cuda::attention;
  for (const auto& [q_heads, kv_heads, kv] : {std::tuple{16, 1, DType::bf16}, std::tuple{32, 4, DType::fp16}}) {
    Case c = named("shape_tile_splits_g" + std::to_string(q_heads / kv_heads) + "_" + msa::dtype_name(kv));
    c.seed = 5150 + q_heads;
    c.kv = kv;
    c.q_heads = q_heads, c.kv_heads = kv_heads;
    c.requests = decodes({900, 40}) + std::vector<RequestShape>{{203, 2900}, {5, 300}, {130, 0}, {2, 700}, {377, 9000}};
    MSA_TRACE_SEED(c.seed);
    OracleStep ref(c);
    const BatchMetadata& meta = ref.w.meta();
    for (const int splits : {0, 1, 2, 3, 4}) {
      DeviceInputs d(ref.w, meta, ref.topk);
      d.tuning.tile_splits = splits;
      Planned p = make_plan(meta, d.args, d.tuning);
      if (att::use_wgmma_tiles(true, q_heads / kv_heads, att::tile_tokens(q_heads / kv_heads, c.topk)) &&
          p.plan.schedule.prefill_splits == 1 && splits > 0)
        EXPECT_EQ(p.plan.schedule.tile_splits, splits);
      msa::cuda::attend(p.plan, d.step.view, d.args, nullptr);
      msa::test::device_sync();
      expect_close(d.result(), ref.want,
                   c.name + " tile_splits " + std::to_string(splits) + " (plan " + std::to_string(p.plan.schedule.tile_splits) +
                       ", prefill splits " + std::to_string(p.plan.schedule.prefill_splits) + ")");
    }
    // The rule with fewer SMs than the device has, so that this step's last
    // round is at most half full: only the tiles from schedule.tile_split_from on
    // split (16/1: 96 tile numbers on 40 SMs, from 80 two ways; 32/4: 204 on
    // 96, from 192 four ways), the whole ones write out directly.
    const int sms = q_heads / kv_heads == 16 ? 40 : 96;
    DeviceInputs d(ref.w, meta, ref.topk);
    d.tuning.tile_split_sms = sms;
    Planned p = make_plan(meta, d.args, d.tuning);
    if (att::use_wgmma_tiles(true, q_heads / kv_heads, att::tile_tokens(q_heads / kv_heads, c.topk)) &&
        p.plan.schedule.prefill_splits == 1) {
      EXPECT_GT(p.plan.schedule.tile_splits, 1);
      EXPECT_GT(p.plan.schedule.tile_split_from, 0);
    }
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr);
    msa::test::device_sync();
    expect_close(d.result(), ref.want,
                 c.name + " last-round split on " + std::to_string(sms) + " SMs (plan " +
                     std::to_string(p.plan.schedule.tile_splits) + " from tile " + std::to_string(p.plan.schedule.tile_split_from) + ")");
  }
  Case c = named("shape_tile_splits_bad");
  c.requests = {{64, 100}};
  OracleStep ref(c);
  DeviceInputs d(ref.w, ref.w.meta(), ref.topk);
  d.tuning.tile_splits = 5;
  try {
    (void)msa::cuda::attention_workspace_bytes(ref.w.meta(), d.args, d.tuning);
    ADD_FAILURE() << "tile_splits = 5 was accepted";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile_splits = 5"), std::string::npos) << e.what();
  }
}

// A decode step captured once in a CUDA graph and replayed with new top-k,
// sequence lengths, block tables and queries copied into the same buffers.
// forced: the plan's split factors (else the heuristic's).
void replay_graph(std::optional<msa::cuda::attention::Splits> forced) {
  Case c = named("graph");
  c.seed = 31337;
  c.q_heads = 32, c.kv_heads = 2;
  c.requests = decodes({300, 1000, 2000, 127});
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata meta0 = w.meta();
  auto topk = random_topk(meta0, c.kv_heads, c.topk, c.seed, false);
  DeviceInputs d(w, meta0, topk);
  Planned p = make_plan(meta0, d.args, {}, forced);
  std::printf("[attention] graph: decode splits %d\n", p.plan.schedule.decode_splits);
  msa::test::CheckBuffer check;
  msa::test::device_sync();  // the plan's counter zeroing ran on the default stream

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
    std::string why;
    EXPECT_TRUE(p.plan.valid_for(meta, d.args, &why)) << why;  // a decode step's plan outlives its lengths
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

TEST(CudaAttentionGraph, ReplayWithNewInputs) {
  MSA_SKIP_WITHOUT_GPU();
  replay_graph(std::nullopt);
}

// The same with 4 decode splits: the row kernel launched in thread-block
// clusters (merge through distributed shared memory) inside the graph.
TEST(CudaAttentionGraph, ReplayWithClusterMerge) {
  MSA_SKIP_WITHOUT_GPU();
  replay_graph(msa::cuda::attention::Splits{4, 1});
}

// Host-side checks name the argument before anything launches.
TEST(CudaAttentionChecks, PlanAndRunMismatches) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("checks");
  c.requests = decodes({10, 20});
  Workload w = make_workload(c);
  const auto topk = random_topk(w.meta(), 1, 16, 1, false);
  DeviceInputs d(w, w.meta(), topk);
  AttentionArgs bad = d.args;
  bad.num_q_heads = 17;
  EXPECT_THROW(msa::cuda::attention_workspace_bytes(w.meta(), bad), msa::Error);
  Planned p = make_plan(w.meta(), d.args);
  if (p.plan.schedule.decode_splits > 1) {
    EXPECT_THROW(msa::cuda::plan_attention(w.meta(), d.args, {p.workspace.data(), 16}, nullptr), msa::Error);
  }
  // The plan says why it does not serve another step or problem.
  std::string why;
  EXPECT_TRUE(p.plan.valid_for(w.meta(), d.args, &why)) << why;
  EXPECT_FALSE(p.plan.valid_for(w.meta(), bad, &why));
  EXPECT_NE(why.find("problem"), std::string::npos) << why;
  msa::BatchSpec longer;
  for (std::int32_t r = 0; r < w.meta().num_requests; ++r) {
    longer.query_lens.push_back(2);
    longer.seq_lens.push_back(w.meta().seq_lens[r] + 1);
  }
  longer.decode_threshold = 2;
  EXPECT_FALSE(p.plan.valid_for(msa::build_metadata(longer), d.args, &why));
  EXPECT_NE(why.find("token counts"), std::string::npos) << why;
  AttentionArgs args = d.args;
  args.num_q_heads = 8;
  EXPECT_THROW(msa::cuda::attend(p.plan, d.step.view, args, nullptr), msa::Error);
  args = d.args;
  args.cache.token_stride += 1;  // not 16-byte aligned
  EXPECT_THROW(msa::cuda::attend(p.plan, d.step.view, args, nullptr), msa::Error);
}

// ---- throughput (numbers for the log; each step's output checked on sampled rows) ---

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
  for (int batch : {32, 64})
    time_attend(std::vector<std::int32_t>(std::size_t(batch), 1), std::vector<std::int32_t>(std::size_t(batch), 16384),
                64, 4, 16, 1);
  // Other split factors of decode batch 32 at 16/1 (2: cluster merge; 8, 16).
  for (int s : {2, 8, 16})
    time_attend(std::vector<std::int32_t>(32, 1), std::vector<std::int32_t>(32, 16384), 16, 1, 16, 1, false,
                msa::cuda::attention::Splits{s, 1});
  time_attend(std::vector<std::int32_t>(64, 4), std::vector<std::int32_t>(64, 16384), 16, 1, 16, 4);
  // Prefill: random rows (every token its own blocks: the tile kernel's worst
  // case) and clustered rows (as real indexers select), 8K and 32K-token chunks.
  time_attend({8192}, {8192}, 16, 1, 16, 1);
  time_attend({8192}, {8192}, 16, 1, 16, 1, true);
  // The row kernel on the same clustered rows (prefill split 2 keeps it off tiles).
  time_attend({8192}, {8192}, 16, 1, 16, 1, true, msa::cuda::attention::Splits{1, 2});
  time_attend({32768}, {32768}, 16, 1, 16, 1, true);
  time_attend({32768}, {65536}, 16, 1, 16, 1, true);
  {  // the mma.sync tile kernel
    msa::cuda::AttentionTuning mma_sync;
    mma_sync.tile_kernel = msa::cuda::TileKernel::mma_sync;
    std::printf("[attention-perf] mma.sync tiles:\n");
    time_attend({8192}, {8192}, 16, 1, 16, 1, false, std::nullopt, mma_sync);
    time_attend({8192}, {8192}, 16, 1, 16, 1, true, std::nullopt, mma_sync);
    time_attend({32768}, {32768}, 16, 1, 16, 1, true, std::nullopt, mma_sync);
  }
  time_attend({8192}, {8192}, 64, 4, 16, 1, true);
  time_attend({4096, 4096}, {32768, 8192}, 16, 1, 16, 1);
  time_attend({4096, 4096}, {32768, 8192}, 16, 1, 16, 1, true);
}

}  // namespace
