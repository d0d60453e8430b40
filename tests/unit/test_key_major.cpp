// cpu::attend_key_major (k2q inversion, per-slot partials, combine) equals the
// query-major cpu::attend on random steps: bf16 / fp8 per-(token, head) / nvfp4
// caches, GQA 1 and 16, topk 1 / 16 / 64, verify + prefill + padding rows,
// shuffled top-k order, a token range, poisoned outputs and partials.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compare.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/k2q.hpp"
#include "msa/key_major.hpp"
#include "msa/numeric.hpp"
#include "workload.hpp"

namespace {

using msa::DType;
constexpr std::uint16_t kPoisonBits = 0x7FFF;  // the bf16 NaN the Workload poisons with
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Case {
  DType kv;
  int q_heads, kv_heads, topk;
  bool shuffle;  // shuffle the valid entries of every top-k row
  bool range;    // key-major over the prefill tokens only
  std::uint64_t seed;
};

std::string describe(const Case& c) {
  return msa::detail::concat("seed ", c.seed, ", kv ", msa::dtype_name(c.kv), ", heads ", c.q_heads,
                             "/", c.kv_heads, ", topk ", c.topk, c.shuffle ? ", shuffled" : "",
                             c.range ? ", prefill range" : "");
}

// A step of verify rows (query length 3), prefills, and one padding request in
// each part (seq_len forced to 0 after the inserts), run through insert and
// index; then attend and attend_key_major are compared.
void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  msa::WorkloadSpec s;
  s.model.num_q_heads = c.q_heads;
  s.model.num_kv_heads = c.kv_heads;
  s.model.topk = c.topk;
  s.model.init_blocks = c.topk > 1 ? 1 : 0;
  s.kv_dtype = c.kv;
  if (c.kv == DType::fp8_e4m3) s.fp8_scales = msa::ScaleMode::per_token_head;
  s.decode_threshold = 3;
  s.seed = c.seed;
  s.num_threads = 2;
  std::mt19937 rng(std::uint32_t(c.seed));
  const int big = c.topk * 128 + 1 + int(rng() % 300);  // enough blocks to fill topk
  s.requests = {{3, big}, {3, 40}, {3, 1 + int(rng() % 200)}, {20 + int(rng() % 30), big - 77},
                {5, 300}, {60 + int(rng() % 40), 0}, {4, 129}};
  msa::Workload w(s);
  const msa::cpu::Options opt = w.cpu_options();
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), opt);
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), opt);

  msa::StepView step = w.step();
  std::vector<std::int32_t> seq_lens(step.seq_lens, step.seq_lens + step.num_requests);
  seq_lens[1] = seq_lens[4] = 0;  // a verify and a prefill padding request
  step.seq_lens = seq_lens.data();
  msa::IndexerArgs ia = w.indexer_args();
  msa::cpu::index(step, ia, opt);

  const int H = c.kv_heads, K = c.topk, T = step.num_tokens, QH = c.q_heads;
  if (c.shuffle) {
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < H; ++h) {
        std::int32_t* row = w.topk_view().row(t, h);
        std::shuffle(row, std::find(row, row + K, -1), rng);
      }
    }
  }

  msa::AttentionArgs args = w.attention_args();
  std::vector<std::uint16_t> want_out(std::size_t(T) * QH * 128, kPoisonBits);
  std::vector<float> want_lse(std::size_t(T) * QH, kNaN);
  args.out = want_out.data();
  args.lse = want_lse.data();
  msa::cpu::attend(step, args, opt);

  const int begin = c.range ? step.num_decode_tokens : 0;
  const msa::K2QPlan plan = msa::build_k2q(step, args.topk, H, begin, T);
  std::vector<float> partial_out(msa::cpu::key_major_partial_floats(T, QH, K), kNaN);
  std::vector<float> partial_lse(partial_out.size() / 128, kNaN);
  std::vector<std::uint16_t> got_out(want_out.size(), kPoisonBits);
  std::vector<float> got_lse(want_lse.size(), kNaN);
  args.out = got_out.data();
  args.lse = got_lse.data();
  msa::cpu::attend_key_major(step, args, plan, partial_out.data(), partial_lse.data(), opt, begin, T);

  std::vector<double> go, wo, gl, wl;
  for (int t = 0; t < T; ++t) {
    const bool padding = step.position(t) < 0;
    for (int q = 0; q < QH; ++q) {
      const std::size_t qh = std::size_t(t) * QH + q;
      if (t < begin) {  // outside the range: untouched
        ASSERT_TRUE(std::isnan(got_lse[qh])) << "t=" << t;
        for (int d = 0; d < 128; ++d) ASSERT_EQ(got_out[qh * 128 + d], kPoisonBits) << "t=" << t;
        continue;
      }
      if (padding) {
        ASSERT_EQ(got_lse[qh], -std::numeric_limits<float>::infinity()) << "t=" << t;
      }
      for (int d = 0; d < 128; ++d) {
        go.push_back(msa::num::bf16_to_float(got_out[qh * 128 + d]));
        wo.push_back(msa::num::bf16_to_float(want_out[qh * 128 + d]));
        if (padding) {
          ASSERT_EQ(go.back(), 0.0) << "t=" << t;
        }
      }
      gl.push_back(got_lse[qh]);
      wl.push_back(want_lse[qh]);
    }
  }
  const msa::ref::Comparison out_cmp = msa::ref::compare_rows(go, wo, std::int64_t(QH) * 128, "out");
  const msa::ref::Comparison lse_cmp = msa::ref::compare_lse(gl, wl, "lse");
  EXPECT_TRUE(out_cmp.rel_ok(2e-3)) << out_cmp.describe();
  EXPECT_TRUE(lse_cmp.abs_ok(1e-4)) << lse_cmp.describe();
}

TEST(KeyMajor, MatchesQueryMajor) {
  const DType dtypes[] = {DType::bf16, DType::fp8_e4m3, DType::nvfp4};
  struct Shape { int q_heads, kv_heads, topk; };
  const Shape shapes[] = {{16, 1, 16}, {2, 2, 1}, {16, 1, 64}, {3, 3, 64}, {32, 2, 16}};
  std::uint64_t seed = 900;
  for (const DType kv : dtypes) {
    for (const Shape& sh : shapes) {
      ++seed;
      run_case({kv, sh.q_heads, sh.kv_heads, sh.topk, seed % 2 == 0, seed % 3 != 0, seed});
    }
  }
}

TEST(KeyMajor, PartialSize) {
  EXPECT_EQ(msa::cpu::key_major_partial_floats(3, 16, 64), std::size_t(3) * 16 * 64 * 128);
  EXPECT_EQ(msa::cpu::key_major_partial_floats(0, 16, 64), 0u);
}

TEST(KeyMajor, RejectsAPlanThatDoesNotMatch) {
  msa::WorkloadSpec s;
  s.model.num_q_heads = 4;
  s.model.num_kv_heads = 2;
  s.requests = {{1, 300}, {40, 200}};
  s.seed = 5;
  s.num_threads = 2;
  msa::Workload w(s);
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), w.cpu_options());
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), w.cpu_options());
  msa::cpu::index(w.step(), w.indexer_args(), w.cpu_options());
  const msa::AttentionArgs args = w.attention_args();
  const int T = w.num_tokens();
  std::vector<float> po(msa::cpu::key_major_partial_floats(T, 4, 16)), pl(po.size() / 128);
  const auto expect_error = [&](const msa::K2QPlan& plan, int begin, const std::string& want) {
    try {
      msa::cpu::attend_key_major(w.step(), args, plan, po.data(), pl.data(), {}, begin, T);
      ADD_FAILURE() << "no error, want " << want;
    } catch (const msa::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const msa::K2QPlan all = msa::build_k2q(w.step(), args.topk, 2);
  expect_error(all, 1, "plan.tokens[0] = 0 in row 0 (h 0, request 0, block 0) is not a token of [1, 41)");
  msa::K2QPlan dropped = all;
  dropped.counts[3] += 1;
  expect_error(dropped, 0, "plan.counts[t=1, h=1]");
  msa::K2QPlan other = all;
  other.num_kv_heads = 1;
  expect_error(other, 0, "plan.num_kv_heads = 1 but the cache has 2");
}

}  // namespace
