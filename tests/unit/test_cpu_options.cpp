// cpu::Options::num_threads: every CPU-engine operation refuses a count
// outside [0, kMaxThreads] before touching memory, naming the option; 0 and
// the largest count run; parallel_for covers every item whatever the count.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <atomic>
#include <cstdint>
#include <vector>

#include "cpu/parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/k2q.hpp"
#include "msa/key_major.hpp"
#include "pre_attention_inputs.hpp"
#include "workload.hpp"

namespace {

using msa::DType;
using msa::Workload;
using msa::WorkloadSpec;
using msa::cpu::kMaxThreads;
using msa::test::expect_error;

WorkloadSpec small_spec() {
  WorkloadSpec s;
  s.model = msa::ModelConfig::minimax_m3(4);
  s.model.topk = 4;
  s.requests = {{1, 300}, {24, 600}};
  s.seed = 5;
  s.num_threads = 2;
  return s;
}

// Each operation with `threads`, on a workload whose index ran.
void run_all(Workload& w, int threads) {
  const msa::cpu::Options opt{threads, true};
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), opt);
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), opt);
  msa::cpu::index(w.step(), w.indexer_args(), opt);
  msa::cpu::attend(w.step(), w.attention_args(), opt);
}

TEST(CpuOptions, ThreadCountsOutsideTheRangeAreRefused) {
  Workload w(small_spec());
  run_all(w, 2);  // valid top-k lists for the calls below
  const msa::K2QPlan plan = msa::build_k2q(w.step(), w.attention_args().topk, w.attention_args().cache.num_kv_heads);
  for (const int bad : {-1, kMaxThreads + 1, 1 << 30}) {
    SCOPED_TRACE(bad);
    const msa::cpu::Options opt{bad, true};
    const std::vector<std::uint8_t> kv = w.kv_bytes, index = w.index_bytes;
    const std::vector<std::int32_t> topk = w.topk;
    w.poison_outputs();
    const std::vector<std::uint8_t> out = w.out;
    const std::vector<std::string> words = {"options.num_threads = " + std::to_string(bad), "[0, 1024]"};
    expect_error([&] { msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), opt); }, words);
    expect_error([&] { msa::cpu::insert_index(w.index_view(), w.insert_index_args(), opt); }, words);
    expect_error([&] { msa::cpu::index(w.step(), w.indexer_args(), opt); }, words);
    std::vector<float> scores(std::size_t(w.num_tokens()) * 1 * std::size_t(w.max_blocks));
    expect_error([&] { msa::cpu::block_scores(w.step(), w.indexer_args(), scores.data(), w.max_blocks, opt); },
                 words);
    expect_error([&] { msa::cpu::attend(w.step(), w.attention_args(), opt); }, words);
    std::vector<float> po(msa::cpu::key_major_partial_floats(w.num_tokens(), w.attention_args().num_q_heads,
                                                        w.attention_args().topk.topk));
    std::vector<float> pl(po.size() / 128 + 1);
    expect_error([&] { msa::cpu::attend_key_major(w.step(), w.attention_args(), plan, po.data(), pl.data(), opt); },
                 words);
    std::vector<std::uint16_t> src(8, 0x3f80);
    std::vector<std::uint8_t> dst(8, 0x55);
    expect_error([&] { msa::cpu::cast_index_query_e4m3(src.data(), DType::bf16, 8, dst.data(), opt); }, words);
    EXPECT_EQ(dst, std::vector<std::uint8_t>(8, 0x55));
    msa::test::PreAttentionInputs in = msa::test::make_pre_attention_inputs(msa::test::PreAttentionCase{});
    const std::vector<std::uint8_t> cache = in.cache, q = in.q;
    expect_error(
        [&] {
          msa::cpu::pre_attention(in.view(in.cache.data(), in.k_scales.data(), in.v_scales.data()),
                                  in.index_view(in.index_cache.data()), in.args(), opt);
        },
        words);
    EXPECT_EQ(in.cache, cache);
    EXPECT_EQ(in.q, q);
    EXPECT_EQ(w.kv_bytes, kv);  // nothing written
    EXPECT_EQ(w.index_bytes, index);
    EXPECT_EQ(w.out, out);
    w.topk = topk;
  }
}

TEST(CpuOptions, ZeroAndTheLargestCountRun) {
  for (const int threads : {0, kMaxThreads}) {
    SCOPED_TRACE(threads);
    Workload w(small_spec());
    run_all(w, threads);
    Workload ref(small_spec());
    run_all(ref, 1);
    EXPECT_EQ(w.topk, ref.topk);
    EXPECT_EQ(w.out, ref.out);
  }
  EXPECT_GE(msa::cpu::resolve_threads(0), 1);
  EXPECT_LE(msa::cpu::resolve_threads(0), kMaxThreads);
  EXPECT_EQ(msa::cpu::resolve_threads(kMaxThreads + 5), kMaxThreads);
}

TEST(CpuOptions, ParallelForCoversEveryItemOnce) {
  for (const int threads : {1, 3, 64}) {
    for (const std::int64_t n : {std::int64_t(0), std::int64_t(1), std::int64_t(1000)}) {
      std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
      msa::cpu::parallel_for(n, threads, 7, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) seen[std::size_t(i)].fetch_add(1);
      });
      for (const auto& s : seen) ASSERT_EQ(s.load(), 1);
    }
  }
}

}  // namespace
