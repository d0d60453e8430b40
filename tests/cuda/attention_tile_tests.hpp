// GPU tests of the token-tile attention kernel (prefill rows as tiles of
// consecutive tokens): the case table, both kernel variants (keys per pass),
// and bad indices inside tiles. Test-only; included by test_cuda_attention.cu.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_test_support.hpp"

namespace {

// Prefill rows through the token-tile kernel (forced: no prefill split), over
// every KV dtype, GQA groups whose tiles do not fill whole warps (G x T of 120,
// 125, 96, 64, 32 rows), top-k 1 / 16 / 64, clustered and random selections,
// sharp scores (a softmax scale 32 times the model's),
// repeated and shuffled entries, causal edges at block boundaries, odd query
// lengths, decode rows in the same step (the row kernel, a second launch), and
// more tiles than SMs (the persistent wgmma CTAs loop over tiles).
std::vector<Case> tile_cases() {
  std::vector<Case> v;
  auto add = [&](Case c, bool random_rows = false) {
    c.seed = 5000 + v.size();
    c.force_tiles = true;
    c.clustered = !random_rows;
    v.push_back(std::move(c));
  };
  // Causal edges: chunks that start / end at block boundaries, one-token chunks.
  const std::vector<RequestShape> edges = {{128, 0}, {129, 127}, {127, 1}, {2, 2046}, {300, 1700}, {7, 0}};
  const auto mixed = decodes({5, 300, 2048}) + edges;
  const auto small = decodes({40}) + std::vector<RequestShape>{{37, 200}, {9, 0}};
  {
    Case c = named("tiles_bf16_g16");
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_bf16_g16_random");
    c.requests = mixed;
    add(c, true);
  }
  {
    Case c = named("tiles_bf16_g16_small");
    c.requests = small;
    c.small = true;
    add(c);
  }
  {  // a softmax scale 32 times the model's, so that rows' maxima move by more
     // than the rescale slack from block to block (O rescaled mid-tile)
    Case c = named("tiles_bf16_g16_sharp");
    c.score_gain = 32.0f;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_fp16_g8_sharp_random_small");
    c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.q_heads = 16, c.kv_heads = 2, c.score_gain = 32.0f;
    c.requests = small + std::vector<RequestShape>{{130, 1000}};
    c.small = true;
    add(c, true);
  }
  {
    Case c = named("tiles_fp16_g8_shuffled");
    c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.q_heads = 16, c.kv_heads = 2, c.shuffle_topk = true;
    c.requests = mixed;
    add(c);
  }
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (ScaleMode sm : {ScaleMode::per_tensor, ScaleMode::per_token_head}) {
      Case c = named(std::string("tiles_") + msa::dtype_name(kv) +
                     (sm == ScaleMode::per_tensor ? "_tensor_bf16" : "_token_fp16"));
      c.kv = kv, c.scales = sm;
      c.q = sm == ScaleMode::per_tensor ? DType::bf16 : DType::fp16;
      c.q_heads = sm == ScaleMode::per_tensor ? 16 : 8, c.kv_heads = sm == ScaleMode::per_tensor ? 1 : 2;
      c.requests = small + std::vector<RequestShape>{{130, 1000}};
      c.small = kv == DType::fp8_e4m3 && sm == ScaleMode::per_token_head;
      add(c);
    }
  }
  for (DType q : {DType::bf16, DType::fp16}) {
    Case c = named(std::string("tiles_nvfp4_") + msa::dtype_name(q));
    c.kv = DType::nvfp4, c.q = q, c.scales = ScaleMode::none;
    c.q_heads = q == DType::bf16 ? 16 : 24, c.kv_heads = q == DType::bf16 ? 1 : 2;  // G 16, 12
    c.requests = small + std::vector<RequestShape>{{130, 1000}};
    c.small = q == DType::fp16;
    add(c);
  }
  {  // fp8 caches through the wgmma kernel (widened by its producer): fp16 MMA, small
    Case c = named("tiles_fp8_e4m3_tensor_fp16_small");
    c.kv = DType::fp8_e4m3, c.scales = ScaleMode::per_tensor, c.q = DType::fp16;
    c.requests = small + std::vector<RequestShape>{{129, 127}};
    c.small = true;
    add(c);
  }
  {
    Case c = named("tiles_fp8_e5m2_tensor_g8_nhd_small");
    c.kv = DType::fp8_e5m2, c.scales = ScaleMode::per_tensor, c.layout = Layout::nhd;
    c.q_heads = 16, c.kv_heads = 2;
    c.requests = small + std::vector<RequestShape>{{33, 250}};
    c.small = true;
    add(c);
  }
  {
    Case c = named("tiles_fp8_query");
    c.q = DType::fp8_e4m3, c.kv = DType::fp8_e4m3;
    c.requests = small + std::vector<RequestShape>{{70, 500}};
    add(c);
  }
  {
    Case c = named("tiles_g5_nhd");  // T 25: 125 rows, warp 7 half used
    c.q_heads = 10, c.kv_heads = 2, c.layout = Layout::nhd;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_g12_page_stride");  // T 10: 120 rows
    c.q_heads = 12, c.kv_heads = 1, c.extra_page_stride = 64;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_g3");  // T 32: 96 rows
    c.q_heads = 6, c.kv_heads = 2;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_g1_split_layout");  // T 32: 32 rows, two warps
    c.q_heads = 4, c.kv_heads = 4, c.layout = Layout::split;
    c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.requests = small + std::vector<RequestShape>{{100, 3000}};
    add(c);
  }
  {  // the wgmma kernel's TMA maps over other layouts (axes in another stride order)
    Case c = named("tiles_g16_nhd_page_stride");
    c.q_heads = 32, c.kv_heads = 2, c.layout = Layout::nhd, c.extra_page_stride = 64;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_g8_split_layout_fp16");
    c.q_heads = 24, c.kv_heads = 3, c.layout = Layout::split;
    c.kv = DType::fp16, c.q = DType::bf16, c.scales = ScaleMode::none;
    c.requests = small + std::vector<RequestShape>{{100, 3000}};
    c.small = true;
    add(c);
  }
  {
    Case c = named("tiles_g1_topk1");  // T 64: bit 63 of the token masks
    c.q_heads = 2, c.kv_heads = 2, c.topk = 1;
    c.requests = decodes({700}) + std::vector<RequestShape>{{200, 60}, {65, 900}};
    add(c);
  }
  {
    Case c = named("tiles_g16_topk1");
    c.topk = 1;
    c.requests = mixed;
    add(c);
  }
  {
    Case c = named("tiles_g16_topk64");  // 512 (token, entry) pairs per tile
    c.topk = 64, c.q_heads = 16, c.kv_heads = 1;
    c.requests = decodes({9000}) + std::vector<RequestShape>{{75, 8500}, {40, 0}};
    add(c);
  }
  {
    Case c = named("tiles_g4_topk64_random");  // T 8: 32 rows, 512 pairs
    c.topk = 64, c.q_heads = 8, c.kv_heads = 2;
    c.requests = std::vector<RequestShape>{{33, 6000}, {17, 100}};
    add(c, true);
  }
  {  // more tiles than SMs: the persistent wgmma CTAs take several tiles each
    Case c = named("tiles_bf16_g16_persistent");
    c.requests = decodes({77}) + std::vector<RequestShape>{{1500, 600}, {777, 3000}, {3, 0}};
    add(c);
  }
  {
    Case c = named("tiles_fp16_g8_persistent_random_small");
    c.kv = DType::fp16, c.q = DType::fp16, c.scales = ScaleMode::none;
    c.q_heads = 16, c.kv_heads = 2;
    c.requests = std::vector<RequestShape>{{900, 130}, {301, 0}};
    c.small = true;
    add(c, true);
  }
  {
    Case c = named("tiles_verify_and_prefill");
    c.decode_threshold = 3, c.q_heads = 16, c.kv_heads = 2;
    c.requests = decodes({3, 1000}, 3) + std::vector<RequestShape>{{4, 129}, {250, 250}};
    add(c);
  }
  return v;
}

class CudaAttentionTiles : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionTiles, MatchesOracleAndCpu) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode() && !GetParam().small) GTEST_SKIP() << "large case";
  run_case(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttentionTiles, ::testing::ValuesIn(tile_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The same cases on the mma.sync tile kernel (the cases of bf16 / fp16 caches
// with 128-row tiles run on the wgmma kernel above).
class CudaAttentionTilesMmaSync : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionTilesMmaSync, MatchesOracleAndCpu) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode() && !GetParam().small) GTEST_SKIP() << "large case";
  msa::cuda::AttentionTuning tuning;
  tuning.tile_kernel = msa::cuda::TileKernel::mma_sync;
  run_case(GetParam(), tuning);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttentionTilesMmaSync, ::testing::ValuesIn(tile_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// fp8 / nvfp4 wgmma tiles over blocks widened ahead (per-token fp8 scales
// with the pages' scales), in the modes the default case table does not reach: never widened
// (widen_bytes 0, the tiles widen on the fly), and gated steps whose room
// holds exactly the selected pages (the widened tiles run) or one page fewer
// (the device falls back to the on-the-fly tiles).
enum class WidenMode { on_the_fly, exact_room, one_page_short };

struct WidenCase {
  Case c;
  WidenMode mode;
};
void PrintTo(const WidenCase& w, std::ostream* os) { *os << w.c.name; }

std::vector<WidenCase> widen_cases() {
  std::vector<WidenCase> v;
  namespace att = msa::cuda::attention;
  for (const Case& c : tile_cases()) {
    const int group = c.q_heads / c.kv_heads;
    if (!att::widens_exactly(c.kv) ||
        !att::use_wgmma_tiles(true, group, att::tile_tokens(group, c.topk)))
      continue;
    for (WidenMode m : {WidenMode::on_the_fly, WidenMode::exact_room, WidenMode::one_page_short}) {
      WidenCase w{c, m};
      w.c.name += m == WidenMode::on_the_fly ? "_on_the_fly" : m == WidenMode::exact_room ? "_exact_room" : "_short";
      v.push_back(w);
    }
  }
  return v;
}

class CudaAttentionTilesWiden : public ::testing::TestWithParam<WidenCase> {};

TEST_P(CudaAttentionTilesWiden, MatchesOracle) {
  MSA_SKIP_WITHOUT_GPU();
  const WidenCase& wc = GetParam();
  if (msa::test::sanitizer_mode() && !wc.c.small) GTEST_SKIP() << "large case";
  Case c = wc.c;
  if (wc.mode == WidenMode::on_the_fly) c.widen_bytes = 0;
  else c.widen_spare_pages = wc.mode == WidenMode::exact_room ? 0 : -1;
  run_case(c);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttentionTilesWiden, ::testing::ValuesIn(widen_cases()),
                         [](const ::testing::TestParamInfo<WidenCase>& i) { return i.param.c.name; });

// The same through the token-tile kernel: bad ids of prefill rows and a bad
// block-table entry are skipped (for every token of the tile that selected
// the block) and recorded; the other rows and entries are attended. An fp8
// cache checks them before widening its blocks ahead.
void tiles_skip_and_record_bad_indices(DType kv) {
  Case c = named(std::string("tiles_bad_indices_") + msa::dtype_name(kv));
  c.kv = kv;
  c.seed = 515;
  c.requests = decodes({300}) + std::vector<RequestShape>{{40, 900}, {19, 0}};
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto good = clustered_topk(meta, c.kv_heads, c.topk, c.seed, false);
  const std::int32_t t0 = meta.query_start[1];  // request 1's first token

  {  // ineligible, huge and repeated ids in prefill rows
    auto topk = good;
    const int last = meta.token_position[t0 + 3] / 128;
    topk[std::size_t(t0 + 3) * c.topk + 1] = last + 1;
    topk[std::size_t(t0 + 9) * c.topk + 0] = 1 << 30;
    topk[std::size_t(t0 + 10) * c.topk + 2] = topk[std::size_t(t0 + 10) * c.topk];
    DeviceInputs d(w, meta, topk);
    Planned p = make_tiles_plan(meta, d.args);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    const std::string msg = check.message();
    std::printf("[attention] tiles: bad top-k recorded: %s\n", msg.c_str());
    EXPECT_NE(msg.find("topk[t="), std::string::npos) << msg;
    w.topk = topk;
    expect_close(d.result(), oracle(w, meta, topk), "tiles: bad top-k ids skipped");
  }
  {  // a block-table entry beyond the cache, selected by several prefill tokens
    DeviceInputs d(w, meta, good);
    const std::int32_t bad_page = std::int32_t(w.num_pages + 3);
    const std::int32_t block = good[std::size_t(t0 + 20) * c.topk];  // an early block of the chunk
    MSA_CUDA_CHECK(cudaMemcpy(d.table.data() + 1 * w.table_stride + block, &bad_page, sizeof(bad_page),
                              cudaMemcpyHostToDevice));
    Planned p = make_tiles_plan(meta, d.args);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    const std::string msg = check.message();
    std::printf("[attention] tiles: bad block table recorded: %s\n", msg.c_str());
    EXPECT_NE(msg.find("block_table[r=1, b=" + std::to_string(block) + "] = " + std::to_string(bad_page)),
              std::string::npos)
        << msg;
    auto want_topk = good;  // the oracle skips that block for request 1's rows
    std::replace(want_topk.begin() + std::size_t(meta.query_start[1]) * c.topk,
                 want_topk.begin() + std::size_t(meta.query_start[2]) * c.topk, block, -1);
    w.topk = want_topk;
    expect_close(d.result(), oracle(w, meta, want_topk), "tiles: bad block-table entry skipped");
  }
}

TEST(CudaAttentionRows, TilesSkipAndRecordBadIndices) {
  MSA_SKIP_WITHOUT_GPU();
  tiles_skip_and_record_bad_indices(DType::bf16);
}

TEST(CudaAttentionRows, WidenedTilesSkipAndRecordBadIndices) {
  MSA_SKIP_WITHOUT_GPU();
  tiles_skip_and_record_bad_indices(DType::fp8_e4m3);
}

// The first tile of a wgmma CTA takes the block of its last position (the
// "lead block") as its first entry, loaded before the union is built. Rows
// that did not select that block must not see it, whichever tokens of the
// tile did; and an unselected lead block with a bad block-table entry is
// neither read nor recorded. The same over fp8 blocks widened ahead (the
// lead block's page then comes from the widened blocks' table).
void rows_without_their_own_block(DType kv) {
  Case c = named(std::string("tiles_lead_block_") + msa::dtype_name(kv));
  c.kv = kv;
  c.seed = 516;
  // Request 0: one block for all its tokens; 1: positions 0-18 (the own block
  // is the only eligible one); 2: tiles across the block boundary at 1024.
  c.requests = std::vector<RequestShape>{{40, 900}, {19, 0}, {130, 1000}};
  MSA_TRACE_SEED(c.seed);
  Workload w = make_workload(c);
  const BatchMetadata& meta = w.meta();
  const auto good = clustered_topk(meta, c.kv_heads, c.topk, c.seed, false);
  // The lists without each token's own block (kept ascending, -1 at the end)
  // for the tokens `drop` picks.
  auto without_own = [&](auto drop) {
    auto topk = good;
    for (std::int32_t t = 0; t < meta.num_tokens; ++t) {
      if (!drop(t)) continue;
      const std::int32_t own = meta.token_position[t] / 128;
      for (int h = 0; h < c.kv_heads; ++h) {
        auto row = topk.begin() + (std::int64_t(t) * c.kv_heads + h) * c.topk;
        auto end = std::remove(row, row + c.topk, own);
        std::fill(end, row + c.topk, -1);
      }
    }
    return topk;
  };
  auto run = [&](const std::vector<std::int32_t>& topk, bool bad_page, const char* what) {
    DeviceInputs d(w, meta, topk);
    if (bad_page) {  // request 0's own block, selected by none of its tokens
      const std::int32_t page = std::int32_t(w.num_pages + 5), block = meta.token_position[0] / 128;
      MSA_CUDA_CHECK(cudaMemcpy(d.table.data() + block, &page, sizeof(page), cudaMemcpyHostToDevice));
    }
    Planned p = make_tiles_plan(meta, d.args);
    msa::test::CheckBuffer check;
    msa::cuda::attend(p.plan, d.step.view, d.args, nullptr, check.get());
    msa::test::device_sync();
    EXPECT_EQ(check.message(), "") << what;
    w.topk = topk;
    expect_close(d.result(), oracle(w, meta, topk), what);
  };
  run(without_own([](std::int32_t t) { return t % 2 == 0; }), false, "tiles: every other token without its own block");
  run(without_own([](std::int32_t) { return true; }), false, "tiles: no token with its own block");
  run(without_own([&](std::int32_t t) { return t < meta.query_start[1]; }), true,
      "tiles: unselected own block with a bad page");
}

TEST(CudaAttentionTileLead, RowsWithoutTheirOwnBlock) {
  MSA_SKIP_WITHOUT_GPU();
  rows_without_their_own_block(DType::bf16);
}

TEST(CudaAttentionTileLead, WidenedRowsWithoutTheirOwnBlock) {
  MSA_SKIP_WITHOUT_GPU();
  rows_without_their_own_block(DType::fp8_e5m2);
}

}  // namespace
