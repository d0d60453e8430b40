// GPU tests of the key-major prefill (key_major.hpp: the k2q plan, work items
// of one block and up to T tokens, partials, their merge): forced on
// (PrefillOrder::key_major) over bf16 / fp16 caches and over the blocks of
// fp8 (per-tensor scales) and nvfp4 caches widened ahead, every GQA group whose
// tiles are 128 rows, top-k 8 / 16 / 64, clustered and random selections,
// shuffled entries, odd chunk lengths and causal edges, other cache layouts,
// more items than SMs; the device's own choice between key-major and token
// tiles; bad indices. Test-only; included by
// test_cuda_attention.cu.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_test_support.hpp"

namespace {

std::vector<Case> key_major_cases() {
  std::vector<Case> v;
  auto add = [&](Case c, bool clustered) {
    c.seed = 7000 + v.size();
    c.force_tiles = true;
    c.expect_key_major = 1;
    c.clustered = clustered;
    v.push_back(std::move(c));
  };
  // Prefill only (key-major never runs with decode rows in the step).
  const std::vector<RequestShape> edges = {{300, 1700}, {129, 127}, {128, 0}, {7, 0}, {2, 2046}};
  const std::vector<RequestShape> small = {{37, 200}, {9, 0}};
  {
    Case c = named("km_bf16_g16_random");
    c.requests = edges;
    add(c, false);
  }
  {
    Case c = named("km_bf16_g16_clustered");
    c.requests = edges;
    add(c, true);
  }
  {
    Case c = named("km_bf16_g16_small");
    c.requests = small;
    c.small = true;
    add(c, false);
  }
  {
    Case c = named("km_fp16_g8_shuffled_small");
    c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.q_heads = 16, c.kv_heads = 2, c.shuffle_topk = true;
    c.requests = small + std::vector<RequestShape>{{130, 1000}};
    c.small = true;
    add(c, false);
  }
  {
    Case c = named("km_bf16_g4_random");  // T 32
    c.q_heads = 8, c.kv_heads = 2;
    c.requests = edges;
    add(c, false);
  }
  {
    Case c = named("km_bf16_g2_topk8_small");  // T 64: all 64 bits of a token mask
    c.q_heads = 4, c.kv_heads = 2, c.topk = 8;
    c.requests = std::vector<RequestShape>{{200, 60}, {65, 900}};
    c.small = true;
    add(c, false);
  }
  {
    Case c = named("km_g16_topk64");
    c.topk = 64;
    c.requests = std::vector<RequestShape>{{75, 8500}, {40, 0}};
    add(c, true);
  }
  {  // the TMA maps over other layouts
    Case c = named("km_g16_nhd_page_stride");
    c.q_heads = 32, c.kv_heads = 2, c.layout = Layout::nhd, c.extra_page_stride = 64;
    c.requests = edges;
    add(c, false);
  }
  {
    Case c = named("km_fp16_bf16q_g8_split_layout");
    c.kv = DType::fp16, c.q = DType::bf16, c.scales = ScaleMode::none, c.layout = Layout::split;
    c.q_heads = 24, c.kv_heads = 3;
    c.requests = small + std::vector<RequestShape>{{100, 3000}};
    add(c, false);
  }
  // fp8 (per-tensor scales) and nvfp4 caches: the selected blocks widened
  // ahead, key-major over them (bf16 / fp16 pages by the output's type).
  {
    Case c = named("km_fp8_e4m3_g16_random");
    c.kv = DType::fp8_e4m3, c.scales = ScaleMode::per_tensor;
    c.requests = edges;
    add(c, false);
  }
  {
    Case c = named("km_fp8_e5m2_fp16_g8_nhd_small");
    c.kv = DType::fp8_e5m2, c.scales = ScaleMode::per_tensor, c.q = DType::fp16, c.layout = Layout::nhd;
    c.q_heads = 16, c.kv_heads = 2;
    c.requests = small + std::vector<RequestShape>{{33, 250}};
    c.small = true;
    add(c, false);
  }
  {
    Case c = named("km_fp8_query_small");  // an fp8 query: its rows converted by the loaders
    c.kv = DType::fp8_e4m3, c.scales = ScaleMode::per_tensor, c.q = DType::fp8_e4m3;
    c.requests = small + std::vector<RequestShape>{{70, 500}};
    c.small = true;
    add(c, true);
  }
  {
    Case c = named("km_nvfp4_g16_random");
    c.kv = DType::nvfp4, c.scales = ScaleMode::none;
    c.requests = edges;
    add(c, false);
  }
  {
    Case c = named("km_nvfp4_fp16_g8_small");
    c.kv = DType::nvfp4, c.scales = ScaleMode::none, c.q = DType::fp16;
    c.q_heads = 16, c.kv_heads = 2;
    c.requests = small + std::vector<RequestShape>{{130, 1000}};
    c.small = true;
    add(c, false);
  }
  {  // more work items than SMs: persistent CTAs take many items each
    Case c = named("km_bf16_g16_persistent");
    c.requests = std::vector<RequestShape>{{1500, 600}, {777, 3000}, {3, 0}};
    add(c, false);
  }
  return v;
}

// The tuning that runs a step key-major whatever its size.
msa::cuda::AttentionTuning key_major_always() {
  msa::cuda::AttentionTuning t;
  t.prefill_order = msa::cuda::PrefillOrder::key_major;
  return t;
}

class CudaAttentionKeyMajor : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionKeyMajor, MatchesOracleAndCpu) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode() && !GetParam().small) GTEST_SKIP() << "large case";
  run_case(GetParam(), key_major_always());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttentionKeyMajor, ::testing::ValuesIn(key_major_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The device's choice (the automatic order from any size on, the device
// choosing as it does for large steps): random selections, whose
// tiles load a union of ~90 blocks for 8 tokens here, run key-major;
// clustered ones run as token tiles. Both match.
TEST(CudaAttentionKeyMajorChoice, RandomRunsKeyMajorClusteredRunsTiles) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode()) GTEST_SKIP() << "large case";
  msa::cuda::AttentionTuning choosing;
  choosing.prefill_order = msa::cuda::PrefillOrder::automatic;
  choosing.key_major_min_tokens = 0;
  for (bool clustered : {false, true}) {
    Case c = named(clustered ? "km_choice_clustered" : "km_choice_random");
    c.seed = clustered ? 7101 : 7102;
    c.clustered = clustered;
    c.force_tiles = true;
    c.expect_key_major = clustered ? 0 : 1;
    c.requests = std::vector<RequestShape>{{1100, 20000}, {300, 0}};
    run_case(c, choosing);
  }
}

// Key-major with bad indices: an ineligible id, a huge id and a repeat are
// skipped and recorded by the k2q plan; a block-table entry beyond the cache
// is skipped (for every token that selected the block) and recorded.
TEST(CudaAttentionKeyMajorChoice, SkipsAndRecordsBadIndices) {
  MSA_SKIP_WITHOUT_GPU();
  Case c = named("km_bad_indices");
  c.seed = 717;
  c.requests = std::vector<RequestShape>{{40, 900}, {19, 0}};
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto good = clustered_topk(meta, c.kv_heads, c.topk, c.seed, false);
  // Attends key-major, returns what the device check recorded.
  auto attend = [&](DeviceInputs& d) {
    Planned p = make_tiles_plan(meta, d.args, key_major_always());
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    expect_ran_key_major(p.plan);
    return check.message();
  };
  {
    auto topk = good;
    const int last = meta.token_position[3] / 128;
    topk[std::size_t(3) * c.topk + 1] = last + 1;
    topk[std::size_t(9) * c.topk + 0] = 1 << 30;
    topk[std::size_t(10) * c.topk + 2] = topk[std::size_t(10) * c.topk];
    DeviceInputs d(w, meta, topk);
    const std::string msg = attend(d);
    std::printf("[attention] key-major: bad top-k recorded: %s\n", msg.c_str());
    EXPECT_NE(msg.find("topk[t="), std::string::npos) << msg;
    w.topk = topk;
    expect_close(d.result(), oracle(w, meta, topk), "key-major: bad top-k ids skipped");
  }
  {
    DeviceInputs d(w, meta, good);
    const std::int32_t bad_page = std::int32_t(w.num_pages + 3);
    const std::int32_t block = good[std::size_t(20) * c.topk];
    MSA_CUDA_CHECK(cudaMemcpy(d.table.data() + 0 * w.table_stride + block, &bad_page, sizeof(bad_page),
                              cudaMemcpyHostToDevice));
    const std::string msg = attend(d);
    std::printf("[attention] key-major: bad block table recorded: %s\n", msg.c_str());
    EXPECT_NE(msg.find("block_table[r=0, b=" + std::to_string(block) + "] = " + std::to_string(bad_page)),
              std::string::npos)
        << msg;
    auto want_topk = good;  // the oracle skips that block for request 0's rows
    std::replace(want_topk.begin(), want_topk.begin() + std::size_t(meta.query_start[1]) * c.topk, block, -1);
    w.topk = want_topk;
    expect_close(d.result(), oracle(w, meta, want_topk), "key-major: bad block-table entry skipped");
  }
}

}  // namespace
