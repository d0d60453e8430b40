// CPU tests of the CUDA attention's schedule (src/cuda/attention/schedule.hpp):
// the kernel family each class of rows gets, the tuning's knobs, the cluster
// decision and the workspace map (one bump allocation: pieces in order, aligned,
// without overlap). Pure functions of the step, the problem, the tuning and
// the device facts; no device needed.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/attention/host/schedule.hpp"
#include "msa/error.hpp"

namespace {

namespace att = msa::cuda::attention;
using msa::BatchMetadata;
using msa::DType;
using msa::cuda::AttentionProblem;
using msa::cuda::AttentionSchedule;
using msa::cuda::AttentionTuning;
using msa::cuda::PrefillKernel;

constexpr int kH200Sms = 132;

BatchMetadata step(std::vector<std::int32_t> query_lens, std::vector<std::int32_t> seq_lens, int threshold = 1) {
  msa::BatchSpec spec;
  spec.query_lens = std::move(query_lens);
  spec.seq_lens = std::move(seq_lens);
  spec.decode_threshold = threshold;
  return msa::build_metadata(spec);
}

AttentionProblem problem(int q_heads, int kv_heads, DType kv = DType::bf16, int topk = 16) {
  AttentionProblem p;
  p.num_q_heads = q_heads;
  p.num_kv_heads = kv_heads;
  p.topk = topk;
  p.kv_dtype = kv;
  return p;
}

std::size_t fake_k2q_bytes(std::int32_t tokens, std::int32_t, int heads, int topk, std::int64_t) {
  return std::size_t(tokens) * std::size_t(heads) * std::size_t(topk) * 12 + 4096;
}

att::DeviceFacts h200() {
  att::DeviceFacts f;
  f.num_sms = kH200Sms;
  for (int s = 2; s <= att::kMaxClusterSplits; ++s) f.split_capacity.clusters[s] = f.row_capacity.clusters[s] = 16;
  f.k2q_bytes = &fake_k2q_bytes;
  return f;
}

AttentionSchedule schedule(const BatchMetadata& m, const AttentionProblem& p, const AttentionTuning& t = {},
                           const att::DeviceFacts& f = h200()) {
  att::check_problem(p);
  att::check_tuning(t);
  return att::make_schedule(m, p, t, f);
}

TEST(AttentionSchedule, DecodeStepsRunTheRowKernelInClusters) {
  const AttentionSchedule s = schedule(step({1, 1, 1, 1}, {3000, 9000, 200, 17000}), problem(16, 1));
  EXPECT_EQ(s.prefill, PrefillKernel::none);
  EXPECT_GT(s.decode_splits, 1);
  EXPECT_EQ(s.decode_cluster, s.decode_splits);  // 4 rows of clusters fit at once
  EXPECT_EQ(s.decode_ctas, 4 * s.decode_splits);
  EXPECT_EQ(s.tiles, 0);
  EXPECT_EQ(s.num_requests, 0);  // a decode step's schedule does not depend on it
  // Cluster merging merges nothing through the workspace, but the partials are
  // laid out for the workspace merge all the same (the counters zeroed once).
  EXPECT_EQ(s.map.max_splits, s.decode_splits);
  EXPECT_EQ(s.map.partial_tokens, 4);
  EXPECT_GT(s.map.bytes, 0u);
}

TEST(AttentionSchedule, ClustersThatDoNotFitMergeThroughTheWorkspace) {
  att::DeviceFacts f = h200();
  for (int s = 2; s <= att::kMaxClusterSplits; ++s) f.row_capacity.clusters[s] = 1;
  AttentionTuning t;
  t.decode_splits = 4;
  const AttentionSchedule s = schedule(step({1, 1}, {3000, 9000}), problem(16, 1), t, f);
  EXPECT_EQ(s.decode_splits, 4);
  EXPECT_EQ(s.decode_cluster, 0);
  t.decode_splits = 9;  // beyond the portable cluster size: always the workspace
  EXPECT_EQ(schedule(step({1}, {3000}), problem(16, 1), t).decode_cluster, 0);
}

TEST(AttentionSchedule, PrefillFamilies) {
  const BatchMetadata chunk = step({1, 1, 512}, {3000, 4000, 20000});
  // bf16 / fp16, G 16: the wgmma tiles.
  const AttentionSchedule half = schedule(chunk, problem(16, 1));
  EXPECT_EQ(half.prefill, PrefillKernel::wgmma_tiles);
  EXPECT_EQ(half.tile_tokens, 8);
  EXPECT_EQ(half.tiles, att::tile_ctas(512, 3, 8, 1));
  EXPECT_EQ(half.num_requests, 3);
  // The tuning's mma.sync tiles, and shapes whose tiles are not 128 rows.
  AttentionTuning mma;
  mma.tile_kernel = msa::cuda::TileKernel::mma_sync;
  EXPECT_EQ(schedule(chunk, problem(16, 1), mma).prefill, PrefillKernel::mma_sync_tiles);
  EXPECT_EQ(schedule(chunk, problem(1, 1)).prefill, PrefillKernel::mma_sync_tiles);
  // No tensor maps: no wgmma tiles for a bf16 query.
  att::DeviceFacts no_maps = h200();
  no_maps.tensor_maps = false;
  EXPECT_EQ(schedule(chunk, problem(16, 1), {}, no_maps).prefill, PrefillKernel::mma_sync_tiles);
  // Prefill rows that split run on the row kernel.
  AttentionTuning split;
  split.prefill_splits = 2;
  const AttentionSchedule rows = schedule(chunk, problem(16, 1), split);
  EXPECT_EQ(rows.prefill, PrefillKernel::rows);
  EXPECT_EQ(rows.prefill_ctas, 512 * 2);
  EXPECT_EQ(rows.tiles, 0);
  // fp8 / nvfp4: blocks widened ahead, the bf16 / fp16 tiles over them.
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4}) {
    const AttentionSchedule w = schedule(chunk, problem(16, 1, kv));
    EXPECT_EQ(w.prefill, PrefillKernel::widened_tiles) << msa::dtype_name(kv);
    EXPECT_EQ(w.widen_first_request, 2);
    EXPECT_EQ(w.widen_requests, 1);
    EXPECT_EQ(w.widen_block_cap, 20000 / 128 + 1);
    EXPECT_FALSE(w.widen_gated);
  }
  AttentionTuning never;
  never.widen_bytes = 0;
  EXPECT_EQ(schedule(chunk, problem(16, 1, DType::fp8_e4m3), never).prefill, PrefillKernel::wgmma_tiles);
}

TEST(AttentionSchedule, KeyMajorFollowsTheOrder) {
  const BatchMetadata chunk = step({512, 64}, {20000, 64});
  AttentionTuning t;
  t.prefill_order = msa::cuda::PrefillOrder::key_major;
  const AttentionSchedule km = schedule(chunk, problem(16, 1), t);
  EXPECT_EQ(km.prefill, PrefillKernel::key_major);
  EXPECT_TRUE(km.key_major_always);
  EXPECT_EQ(km.key_major_rows, (20000 + 127) / 128 + 1);
  EXPECT_EQ(km.tile_splits, 1);  // key-major steps never split tiles
  t.prefill_order = msa::cuda::PrefillOrder::automatic;
  EXPECT_EQ(schedule(chunk, problem(16, 1), t).prefill, PrefillKernel::wgmma_tiles);  // below 8192 tokens
  t.key_major_min_tokens = 1;
  const AttentionSchedule choice = schedule(chunk, problem(16, 1), t);
  EXPECT_EQ(choice.prefill, PrefillKernel::key_major);
  EXPECT_FALSE(choice.key_major_always);
  // Never with decode rows in the step.
  EXPECT_NE(schedule(step({1, 512}, {100, 20000}), problem(16, 1), t).prefill, PrefillKernel::key_major);
}

// fp8 (per-tensor scales) and nvfp4 caches run key-major over their selected
// blocks widened ahead; not when the widened region may not hold them all
// (gated), nor with per-token fp8 scales (the widened tiles apply those).
TEST(AttentionSchedule, KeyMajorOverWidenedBlocks) {
  const BatchMetadata chunk = step({512, 64}, {20000, 64});
  AttentionTuning t;
  t.prefill_order = msa::cuda::PrefillOrder::key_major;
  for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4}) {
    const AttentionSchedule s = schedule(chunk, problem(16, 1, kv), t);
    EXPECT_EQ(s.prefill, PrefillKernel::key_major) << msa::dtype_name(kv);
    EXPECT_TRUE(s.key_major_always);
    EXPECT_GT(s.widen_pages, 0);
    EXPECT_FALSE(s.widen_gated);
    EXPECT_FALSE(s.widen_scales);
    EXPECT_EQ(s.widen_first_request, 0);
    EXPECT_EQ(s.widen_requests, 2);
  }
  AttentionProblem scaled = problem(16, 1, DType::fp8_e4m3);
  scaled.kv_token_scales = true;
  EXPECT_EQ(schedule(chunk, scaled, t).prefill, PrefillKernel::widened_tiles);
  AttentionTuning small = t;
  small.widen_bytes = 4 * att::kWidenHeadBytes;  // four pages: gated
  const AttentionSchedule gated = schedule(chunk, problem(16, 1, DType::fp8_e4m3), small);
  EXPECT_EQ(gated.prefill, PrefillKernel::widened_tiles);
  EXPECT_TRUE(gated.widen_gated);
  AttentionTuning never = t;
  never.widen_bytes = 0;
  EXPECT_EQ(schedule(chunk, problem(16, 1, DType::fp8_e4m3), never).prefill, PrefillKernel::wgmma_tiles);
  // The automatic order from the tuning's threshold on, as for bf16.
  AttentionTuning a;
  a.prefill_order = msa::cuda::PrefillOrder::automatic;
  a.key_major_min_tokens = 1;
  const AttentionSchedule choice = schedule(chunk, problem(16, 1, DType::nvfp4), a);
  EXPECT_EQ(choice.prefill, PrefillKernel::key_major);
  EXPECT_FALSE(choice.key_major_always);
  // Both regions in the workspace, apart.
  const auto& m = schedule(chunk, problem(16, 1, DType::fp8_e4m3), t).map;
  EXPECT_GT(m.km_partial_lse, 0u);
  EXPECT_GE(m.widen_table, m.km_partial_lse + 4 * std::size_t(576 * 16 * 16));
  EXPECT_LE(m.widen_v, m.bytes);
}

TEST(AttentionSchedule, TileSplitsOnThePersistentKernelOnly) {
  const BatchMetadata chunk = step({256}, {256});  // 33 tile numbers: few tiles, every tile splits
  const AttentionSchedule s = schedule(chunk, problem(16, 1));
  EXPECT_EQ(s.tile_splits, 4);
  EXPECT_EQ(s.tile_split_from, 0);
  AttentionTuning t;
  t.tile_splits = 2;
  EXPECT_EQ(schedule(chunk, problem(16, 1), t).tile_splits, 2);
  t.tile_kernel = msa::cuda::TileKernel::mma_sync;
  EXPECT_EQ(schedule(chunk, problem(16, 1), t).tile_splits, 1);
  // The rule on fewer SMs: only the last round's tiles split.
  AttentionTuning sms;
  sms.tile_split_sms = 40;
  const AttentionSchedule last = schedule(step({760}, {760}), problem(16, 1), sms);
  EXPECT_GT(last.tile_splits, 1);
  EXPECT_GT(last.tile_split_from, 0);
}

TEST(AttentionSchedule, BadKnobsAndProblemsAreNamed) {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const msa::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  AttentionTuning t;
  t.decode_splits = 17;
  EXPECT_NE(message([&] { att::check_tuning(t); }).find("decode_splits = 17"), std::string::npos);
  t = {};
  t.tile_splits = 5;
  EXPECT_NE(message([&] { att::check_tuning(t); }).find("tile_splits = 5"), std::string::npos);
  t = {};
  t.widen_bytes = -2;
  EXPECT_NE(message([&] { att::check_tuning(t); }).find("widen_bytes = -2"), std::string::npos);
  EXPECT_NE(message([&] { att::check_problem(problem(17, 2)); }).find("num_q_heads = 17"), std::string::npos);
  EXPECT_NE(message([&] { att::check_problem(problem(16, 1, DType::bf16, 65)); }).find("topk.topk = 65"),
            std::string::npos);
  AttentionProblem nvfp4 = problem(16, 1, DType::nvfp4);
  nvfp4.kv_token_scales = true;
  EXPECT_NE(message([&] { att::check_problem(nvfp4); }).find("kv_token_scales"), std::string::npos);
}

// nvfp4 rows run on fp16 MMA whatever the output, so the row kernel's nvfp4
// instance on bf16 MMA is not built; every other instance is.
TEST(AttentionSchedule, RowKernelInstancesThatRun) {
  for (const bool out_f16 : {false, true})
    EXPECT_TRUE(att::row_f16(DType::nvfp4, out_f16, false));
  EXPECT_FALSE(att::row_instance_built(att::KvKind::nvfp4, false));
  EXPECT_TRUE(att::row_instance_built(att::KvKind::nvfp4, true));
  for (const att::KvKind k : {att::KvKind::half, att::KvKind::e4m3, att::KvKind::e5m2})
    for (const bool f16 : {false, true}) EXPECT_TRUE(att::row_instance_built(k, f16));
  EXPECT_EQ(schedule(step({1, 1}, {3000, 9000}), problem(16, 1, DType::nvfp4)).row_f16, true);
}

// The map: every piece in its place, aligned, after the previous one.
void expect_ordered(const std::vector<std::pair<std::size_t, std::size_t>>& pieces, std::size_t end) {
  std::size_t at = 0;
  for (const auto& [offset, bytes] : pieces) {
    EXPECT_GE(offset, at);
    at = offset + bytes;
  }
  EXPECT_LE(at, end);
  EXPECT_EQ(end % att::kWorkspaceAlign, 0u);
}

TEST(AttentionSchedule, WorkspaceMapOfSplitRowsAndTiles) {
  AttentionTuning t;
  t.decode_splits = 4;
  t.prefill_splits = 3;
  const AttentionSchedule s = schedule(step({1, 1, 5}, {300, 400, 700}), problem(16, 2), t);
  const auto& m = s.map;
  EXPECT_EQ(m.partial_tokens, 7);  // prefill rows split too: every token
  EXPECT_EQ(m.max_splits, 4);
  const std::size_t entries = 7 * 16 * 4;
  EXPECT_EQ(m.partial_out, 0u);
  EXPECT_EQ(m.counter_bytes, 7u * 2u * 4u);
  for (std::size_t o : {m.partial_lse, m.counters}) EXPECT_EQ(o % 256, 0u);
  expect_ordered({{m.partial_out, entries * 128 * 4}, {m.partial_lse, entries * 4}, {m.counters, m.counter_bytes}},
                 m.bytes);
  // Nothing splits: no workspace.
  EXPECT_EQ(schedule(step({1}, {300}), problem(16, 1), [] { AttentionTuning one; one.decode_splits = 1; return one; }()).map.bytes, 0u);
  // Split tiles: 16-bit rows then fp32 lse, 256-aligned, after the partials.
  const AttentionSchedule tiles = schedule(step({1, 256}, {300, 256}), problem(16, 1));
  ASSERT_GT(tiles.tile_splits, 1);
  const std::size_t rows = std::size_t(257) * 16 * std::size_t(tiles.tile_splits);
  expect_ordered({{tiles.map.partial_out, 0},
                  {tiles.map.counters, tiles.map.counter_bytes},
                  {tiles.map.tile_partial_out, rows * 256},
                  {tiles.map.tile_partial_lse, rows * 4}},
                 tiles.map.bytes);
  EXPECT_EQ(tiles.map.tile_partial_lse % 256, 0u);
}

TEST(AttentionSchedule, WorkspaceMapOfKeyMajorSteps) {
  AttentionTuning t;
  t.prefill_order = msa::cuda::PrefillOrder::key_major;
  const AttentionSchedule s = schedule(step({300, 40}, {5000, 40}), problem(16, 1), t);
  ASSERT_EQ(s.prefill, PrefillKernel::key_major);
  const auto& m = s.map;
  EXPECT_EQ(m.k2q_edges, 340 * 16);
  EXPECT_EQ(m.k2q_scratch_bytes, fake_k2q_bytes(340, 2, 1, 16, s.key_major_rows));
  const std::size_t partials = 340 * 16 * 16;
  expect_ordered({{m.k2q_offsets, 8 * std::size_t(s.key_major_rows + 1)},
                  {m.k2q_tokens, 4 * std::size_t(m.k2q_edges)},
                  {m.k2q_slots, 4 * std::size_t(m.k2q_edges)},
                  {m.k2q_counts, 4 * 340},
                  {m.k2q_scratch, m.k2q_scratch_bytes},
                  {m.km_items, 32 * std::size_t(m.km_max_items)},
                  {m.km_stats, 32},
                  {m.km_partial_out, partials * 256},
                  {m.km_partial_lse, partials * 4}},
                 m.bytes);
  for (std::size_t o : {m.k2q_tokens, m.k2q_slots, m.k2q_counts, m.k2q_scratch, m.km_items, m.km_stats,
                        m.km_partial_out, m.km_partial_lse})
    EXPECT_EQ(o % 256, 0u);
}

// The widened region: the table (all requests' rows), the counters and claims
// (filled from the first prefill request's table row on), the items and the
// gates 256-byte aligned, the pages 1 KiB aligned, then the pages' scales.
TEST(AttentionSchedule, WorkspaceMapOfWidenedBlocks) {
  const BatchMetadata m0 = step({1, 1, 300, 20}, {900, 300, 65700, 400});
  for (const bool token_scales : {false, true}) {
    AttentionProblem p = problem(16, 4, DType::fp8_e4m3);
    p.num_q_heads = 64;
    p.kv_token_scales = token_scales;
    const AttentionSchedule s = schedule(m0, p);
    ASSERT_EQ(s.prefill, PrefillKernel::widened_tiles);
    EXPECT_EQ(s.widen_scales, token_scales);
    const auto& m = s.map;
    const std::size_t cap = std::size_t(s.widen_block_cap), pages = std::size_t(s.widen_pages);
    EXPECT_EQ(cap, 65700u / 128 + 1);
    EXPECT_EQ(m.widen_table % 256, 0u);
    EXPECT_EQ(m.widen_counters, m.widen_table + 4u * cap * 4u);
    EXPECT_EQ(m.widen_fill, m.widen_table + 2u * cap * 4u);
    EXPECT_EQ(m.widen_claims, m.widen_counters + 16u);
    EXPECT_EQ(m.widen_fill + m.widen_fill_bytes, m.widen_claims + 2u * 4u * cap * 4u);
    EXPECT_EQ(m.widen_items % 256, 0u);
    EXPECT_GE(m.widen_items, m.widen_fill + m.widen_fill_bytes);
    EXPECT_GE(m.widen_gates, m.widen_items + pages * 4u * 16u);
    EXPECT_EQ(m.widen_k % 1024, 0u);
    EXPECT_GE(m.widen_k, m.widen_gates + 16u);
    EXPECT_EQ(m.widen_v, m.widen_k + pages * 4u * 128u * 128u * 2u);
    EXPECT_EQ(m.widen_scales, m.widen_v + pages * 4u * 128u * 128u * 2u);
    EXPECT_EQ(m.bytes, att::align_up(m.widen_scales + (token_scales ? pages * 4u * 2u * 128u * 4u : 0u), 256));
  }
}

}  // namespace
