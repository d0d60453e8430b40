// GPU tests of context parallelism (src/cuda/cp, msa/cuda_cp.hpp):
//  - the kernels against the CPU rules of msa/context_parallel.hpp, bit for
//    bit: local candidates (with the unowned columns poisoned), candidates
//    from each rank's own top-k (and their merge), the merge
//    (= cpu::select_row on the full row), the owned filter; garbage candidates
//    never reach the top-k; the merge of partial results;
//  - N ranks simulated on one GPU: each rank's caches hold only its own pages
//    (block tables -1 elsewhere), the all-gathers are device copies; the global
//    top-k must equal the single-GPU indexer's exactly and the merged attention
//    the single-GPU attention (rel Frobenius 1e-2, lse 1e-3);
//  - the partials merged by gather or by weighing and summing (reduce);
//  - the NCCL path end to end on a one-rank communicator (bit-identical to the
//    single-GPU result), and over every GPU of the machine when it has >= 2.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <cuda_runtime.h>
#if defined(MSA_HAVE_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache_reader.hpp"
#include "compare.hpp"
#include "gpu_test_util.hpp"
#include "msa/context_parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/cuda.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "msa/select.hpp"
#include "workload.hpp"

namespace {

namespace cp = msa::cuda::cp;
using msa::TopkView;
using msa::Workload;
using msa::cp::Candidate;
using msa::cp::Sharding;
using msa::test::DeviceBuffer;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kOutTol = 1e-2;  // rel Frobenius (contract 9)
constexpr double kLseTol = 1e-3;  // absolute

// A synchronous copy of n device elements.
template <typename T>
std::vector<T> download(const T* data, std::size_t n) {
  std::vector<T> host(n);
  if (n > 0) MSA_CUDA_CHECK(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

bool same_bits(const Candidate& a, const Candidate& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string show(const Candidate& c) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "{%g (0x%08x), %d}", double(c.score),
                [&] { std::uint32_t u; std::memcpy(&u, &c.score, 4); return u; }(), c.block);
  return buf;
}

// A row's last block as the kernels see it (-1 for padding rows).
std::int32_t last_block(const msa::BatchMetadata& meta, std::int32_t t, std::int32_t max_blocks) {
  const std::int32_t p = meta.token_position[t];
  return p < 0 ? -1 : std::min(p / msa::kBlockSize, max_blocks - 1);
}

// ---- kernels against the CPU rules ---------------------------------------------------

// Scores with many ties, NaN, -0 and -inf, so that every rule of the order matters.
std::vector<float> random_scores(std::mt19937_64& rng, std::size_t n) {
  std::uniform_int_distribution<int> level(0, 12);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> s(n);
  for (auto& x : s) {
    const float r = u(rng);
    x = r < 0.04f   ? std::numeric_limits<float>::quiet_NaN()
        : r < 0.06f ? -0.0f
        : r < 0.08f ? -kInf
                    : float(level(rng)) * 0.5f - 2.0f;
  }
  return s;
}

struct SelectCase {
  int ranks, run, topk, init, local;
};

// A step of verify decodes (query_len 2, one of them padding), then prefill
// chunks, one of them into a context of about a million tokens.
msa::BatchMetadata selection_step() {
  msa::BatchSpec spec;
  const int big = msa::test::size_for(1 << 20, 40000);
  spec.query_lens = {2, 2, 2, 2, 2, 37, 5, 3};
  spec.seq_lens = {2, 0, 257, 40001, 2049, 37 + 300, big, 129};
  spec.decode_threshold = 2;
  return msa::build_metadata(spec);
}

TEST(CudaCp, KernelsFollowCpuRules) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(5001);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  const msa::BatchMetadata meta = selection_step();
  const msa::test::DeviceStep step(meta);
  const int T = meta.num_tokens, H = 2;
  std::int32_t max_blocks = 0;
  for (int r = 0; r < meta.num_requests; ++r) max_blocks = std::max(max_blocks, meta.num_blocks(r));
  max_blocks += 3;  // columns past every row's last block
  const std::size_t rows = std::size_t(T) * H;

  const std::vector<SelectCase> cases = {
      {1, 0, 16, 0, 1}, {2, 0, 16, 0, 1},  {3, 0, 64, 1, 2},   {8, 0, 16, 1, 1},  {4, 7, 16, 0, 1},
      {5, 1, 1, 0, 1},  {16, 0, 64, 0, 1}, {3, 100, 2, 0, 2},  {2, 3000, 16, 1, 1}, {7, 0, 64, 2, 2},
      {6, 0, 3, 1, 1},  {2, 0, 64, 0, 0}};
  for (const SelectCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.ranks << " ranks, run " << c.run << ", topk " << c.topk
                                      << ", init " << c.init << ", local " << c.local);
    const Sharding sh{c.ranks, c.run};
    const int K = c.topk;
    const cp::SelectShape shape{H, K, c.init, c.local, max_blocks};
    const std::vector<float> scores = random_scores(rng, rows * max_blocks);

    // (a) each rank from a copy whose unowned columns are +inf: any read of one would win.
    DeviceBuffer<Candidate> cands(std::size_t(c.ranks) * rows * K);
    cands.fill_bytes(0x7F);
    for (int r = 0; r < c.ranks; ++r) {
      std::vector<float> mine = scores;
      for (std::size_t row = 0; row < rows; ++row)
        for (int b = 0; b < max_blocks; ++b)
          if (sh.owner(b) != r) mine[row * max_blocks + b] = kInf;
      const DeviceBuffer<float> d(mine);
      cp::local_candidates(step.view, shape, sh, r, d.data(), cands.data() + r * rows * K, nullptr);
      msa::test::device_sync();
    }
    const std::vector<Candidate> got = cands.download();
    std::vector<Candidate> want(K);
    for (int r = 0; r < c.ranks; ++r)
      for (std::size_t row = 0; row < rows; ++row) {
        const std::int32_t last = last_block(meta, std::int32_t(row / H), max_blocks);
        if (last < 0) std::fill(want.begin(), want.end(), Candidate{-kInf, -1});
        else msa::cp::local_candidates(&scores[row * max_blocks], last, sh, r, K, c.init, c.local, want.data());
        for (int k = 0; k < K; ++k) {
          const Candidate& g = got[(r * rows + row) * K + k];
          ASSERT_TRUE(same_bits(g, want[k])) << "rank " << r << " row " << row << " (last " << last
                                             << ") k " << k << ": got " << show(g) << " want " << show(want[k]);
        }
      }

    // (b) the merge equals the single-rank selection on the full rows.
    DeviceBuffer<std::int32_t> topk(rows * K);
    topk.fill_bytes(0x7F);
    cp::merge_candidates(step.view, shape, sh, cands.data(), TopkView::token_major(topk.data(), H, K), nullptr);
    const std::vector<std::int32_t> merged = topk.download();
    std::vector<std::int32_t> single(rows * K, -1), cpu_merged(K);
    std::vector<Candidate> row_cands(std::size_t(c.ranks) * K);
    for (std::size_t row = 0; row < rows; ++row) {
      const std::int32_t last = last_block(meta, std::int32_t(row / H), max_blocks);
      if (last >= 0) msa::cpu::select_row(&scores[row * max_blocks], last, K, c.init, c.local, &single[row * K]);
      for (int r = 0; r < c.ranks; ++r)
        std::copy_n(&got[(r * rows + row) * K], K, &row_cands[std::size_t(r) * K]);
      msa::cp::merge_candidates(row_cands.data(), c.ranks, last, K, c.init, c.local, cpu_merged.data());
      for (int k = 0; k < K; ++k) {
        ASSERT_EQ(merged[row * K + k], single[row * K + k]) << "row " << row << " (last " << last << ") k " << k;
        ASSERT_EQ(merged[row * K + k], cpu_merged[k]) << "row " << row << " k " << k;
      }
    }

    // (a') each rank from its own top-k, the single-rank selection over its
    // scores with NaN for the blocks it does not own; the unowned columns of
    // the scores it is given are +inf. The merge of those lists is the same.
    DeviceBuffer<Candidate> own_cands(std::size_t(c.ranks) * rows * K);
    own_cands.fill_bytes(0x7F);
    std::vector<std::vector<std::int32_t>> own_topk(c.ranks, std::vector<std::int32_t>(rows * K, -1));
    for (int r = 0; r < c.ranks; ++r) {
      std::vector<float> masked = scores, poisoned = scores;
      for (std::size_t row = 0; row < rows; ++row)
        for (int b = 0; b < max_blocks; ++b)
          if (sh.owner(b) != r) {
            masked[row * max_blocks + b] = std::numeric_limits<float>::quiet_NaN();
            poisoned[row * max_blocks + b] = kInf;
          }
      for (std::size_t row = 0; row < rows; ++row) {
        const std::int32_t last = last_block(meta, std::int32_t(row / H), max_blocks);
        if (last >= 0) msa::cpu::select_row(&masked[row * max_blocks], last, K, c.init, c.local, &own_topk[r][row * K]);
      }
      const DeviceBuffer<float> d(poisoned);
      const DeviceBuffer<std::int32_t> own(own_topk[r]);
      cp::topk_candidates(step.view, shape, sh, r, d.data(), TopkView::token_major(own.data(), H, K),
                          own_cands.data() + r * rows * K, nullptr);
      msa::test::device_sync();
    }
    {
      const std::vector<Candidate> from_topk = own_cands.download();
      for (int r = 0; r < c.ranks; ++r)
        for (std::size_t row = 0; row < rows; ++row) {
          const std::int32_t last = last_block(meta, std::int32_t(row / H), max_blocks);
          if (last < 0) std::fill(want.begin(), want.end(), Candidate{-kInf, -1});
          else msa::cp::candidates_from_topk(&scores[row * max_blocks], &own_topk[r][row * K], last, sh, r, K,
                                             c.init, c.local, want.data());
          for (int k = 0; k < K; ++k) {
            const Candidate& g = from_topk[(r * rows + row) * K + k];
            ASSERT_TRUE(same_bits(g, want[k])) << "own top-k, rank " << r << " row " << row << " (last " << last
                                               << ") k " << k << ": got " << show(g) << " want " << show(want[k]);
          }
        }
      DeviceBuffer<std::int32_t> merged_own(rows * K);
      merged_own.fill_bytes(0x7F);
      cp::merge_candidates(step.view, shape, sh, own_cands.data(), TopkView::token_major(merged_own.data(), H, K),
                           nullptr);
      ASSERT_EQ(merged_own.download(), merged) << "the merge of candidates from the ranks' own top-k differs";
    }

    // (c) the owned entries of every rank, and once in place.
    DeviceBuffer<std::int32_t> mine(rows * K);
    std::vector<std::int32_t> want_owned(K);
    for (int r = 0; r <= c.ranks; ++r) {
      const bool in_place = r == c.ranks;
      const int rank = in_place ? c.ranks - 1 : r;
      mine.fill_bytes(0x7F);
      const TopkView in = TopkView::token_major(topk.data(), H, K);
      cp::owned_entries(T, H, in, sh, rank, in_place ? in : TopkView::token_major(mine.data(), H, K), nullptr);
      const std::vector<std::int32_t> owned = in_place ? topk.download() : mine.download();
      for (std::size_t row = 0; row < rows; ++row) {
        msa::cp::owned_entries(&merged[row * K], K, sh, rank, want_owned.data());
        for (int k = 0; k < K; ++k)
          ASSERT_EQ(owned[row * K + k], want_owned[k]) << "rank " << rank << (in_place ? " in place" : "")
                                                       << " row " << row << " k " << k;
      }
    }
  }
}

// Garbage candidates (ids past the row's last block, negative, forced, or not
// owned by the proposing rank) are skipped: the merge equals the CPU merge of
// the list without them. A repeated block never appears twice in a row.
TEST(CudaCp, MergeSkipsBadCandidates) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(5002);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  const msa::BatchMetadata meta = selection_step();
  const msa::test::DeviceStep step(meta);
  const int T = meta.num_tokens, H = 1, K = 16, init = 1, local = 2, R = 3;
  std::int32_t max_blocks = 0;
  for (int r = 0; r < meta.num_requests; ++r) max_blocks = std::max(max_blocks, meta.num_blocks(r));
  const std::size_t rows = std::size_t(T) * H;
  const Sharding sh{R, 0};
  const cp::SelectShape shape{H, K, init, local, max_blocks};
  const std::vector<float> scores = random_scores(rng, rows * max_blocks);

  std::vector<Candidate> clean(std::size_t(R) * rows * K);
  for (int r = 0; r < R; ++r)
    for (std::size_t row = 0; row < rows; ++row) {
      Candidate* c = &clean[(r * rows + row) * K];
      const std::int32_t last = last_block(meta, std::int32_t(row), max_blocks);
      if (last < 0) std::fill(c, c + K, Candidate{-kInf, -1});
      else msa::cp::local_candidates(&scores[row * max_blocks], last, sh, r, K, init, local, c);
    }
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "garbage ids" : "repeated blocks");
    std::vector<Candidate> dirty = clean, cleaned = clean;
    for (int r = 0; r < R; ++r)
      for (std::size_t row = 0; row < rows; ++row) {
        const std::int32_t last = last_block(meta, std::int32_t(row), max_blocks);
        if (last < 0) continue;
        const std::size_t at = (r * rows + row) * K + rng() % K;
        const std::size_t first = (r * rows + row) * K;
        if (variant == 0) {
          const Candidate bad[] = {{kInf, last + 1 + int(rng() % 5)}, {kInf, -7}, {kInf, last},
                                   {kInf, (r + 1) % R + R * int(rng() % (last / R + 1))}};
          dirty[at] = bad[rng() % 4];
          if (R > 1 && dirty[at].block >= 0 && dirty[at].block <= last && sh.owner(dirty[at].block) == r)
            dirty[at] = {kInf, -7};  // the "other rank's block" happened to be ours
          cleaned[at] = {-kInf, -1};
        } else if (dirty[first].block >= 0) {
          dirty[at] = dirty[first];              // the same block twice in one rank's list
          dirty[at].score = (rng() & 1) ? kInf : dirty[at].score;
        }
      }
    const DeviceBuffer<Candidate> d(dirty);
    DeviceBuffer<std::int32_t> topk(rows * K);
    topk.fill_bytes(0x7F);
    cp::merge_candidates(step.view, shape, sh, d.data(), TopkView::token_major(topk.data(), H, K), nullptr);
    const std::vector<std::int32_t> got = topk.download();
    std::vector<std::int32_t> want(K);
    std::vector<Candidate> row_cands(std::size_t(R) * K);
    for (std::size_t row = 0; row < rows; ++row) {
      const std::int32_t last = last_block(meta, std::int32_t(row), max_blocks);
      const std::int32_t* g = &got[row * K];
      if (variant == 0) {
        for (int r = 0; r < R; ++r) std::copy_n(&cleaned[(r * rows + row) * K], K, &row_cands[std::size_t(r) * K]);
        msa::cp::merge_candidates(row_cands.data(), R, last, K, init, local, want.data());
        for (int k = 0; k < K; ++k) ASSERT_EQ(g[k], want[k]) << "row " << row << " k " << k;
        continue;
      }
      // Repeated blocks: ascending distinct ids in [0, last], then -1; every forced block present.
      int n = 0;
      while (n < K && g[n] >= 0) ++n;
      for (int k = 0; k < K; ++k) {
        if (k >= n) { ASSERT_EQ(g[k], -1) << "row " << row << " k " << k; continue; }
        ASSERT_LE(g[k], last) << "row " << row << " k " << k;
        if (k > 0) ASSERT_LT(g[k - 1], g[k]) << "row " << row << " k " << k;
      }
      for (int b = 0; b <= last; ++b)
        if (msa::select::is_forced(b, last, init, local))
          ASSERT_TRUE(std::binary_search(g, g + n, b)) << "row " << row << " forced block " << b;
    }
  }
}

TEST(CudaCp, MergePartialsFollowsCpu) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(5003);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const std::int64_t rows = 77;
  struct DCase { int ranks; msa::DType in, out; };
  for (const DCase c : {DCase{1, msa::DType::bf16, msa::DType::bf16}, DCase{3, msa::DType::bf16, msa::DType::bf16},
                        DCase{5, msa::DType::f32, msa::DType::f32}, DCase{4, msa::DType::fp16, msa::DType::f32}}) {
    SCOPED_TRACE(::testing::Message() << c.ranks << " ranks, " << msa::dtype_name(c.in) << " -> "
                                      << msa::dtype_name(c.out));
    const std::size_t n = std::size_t(c.ranks) * rows * 128;
    std::vector<float> outs(n), lses(std::size_t(c.ranks) * rows);
    for (auto& x : outs) x = g(rng);
    for (std::size_t i = 0; i < lses.size(); ++i) {
      const std::int64_t row = std::int64_t(i) % rows;
      lses[i] = row % 7 == 0 || rng() % 5 == 0 ? -kInf : 3.0f * g(rng);  // rows % 7 == 0: empty everywhere
    }
    // A rank with no keys may hold anything: NaN must not leak.
    for (std::size_t i = 0; i < lses.size(); ++i)
      if (lses[i] == -kInf) std::fill_n(&outs[i * 128], 128, std::numeric_limits<float>::quiet_NaN());
    // Device input in its dtype; the CPU sees the same (rounded) values.
    std::vector<std::uint16_t> half(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (c.in == msa::DType::f32) continue;
      half[i] = c.in == msa::DType::bf16 ? msa::num::float_to_bf16(outs[i]) : msa::num::float_to_fp16(outs[i]);
      outs[i] = c.in == msa::DType::bf16 ? msa::num::bf16_to_float(half[i]) : msa::num::fp16_to_float(half[i]);
    }
    DeviceBuffer<std::uint8_t> d_in(n * msa::dtype_bytes(c.in));
    MSA_CUDA_CHECK(cudaMemcpy(d_in.data(), c.in == msa::DType::f32 ? static_cast<const void*>(outs.data()) : half.data(),
                              d_in.bytes(), cudaMemcpyHostToDevice));
    const DeviceBuffer<float> d_lse(lses);
    DeviceBuffer<std::uint8_t> d_out(std::size_t(rows) * 128 * msa::dtype_bytes(c.out));
    DeviceBuffer<float> d_lse_out(static_cast<std::size_t>(rows));
    d_out.poison_nan();
    d_lse_out.poison_nan();
    cp::merge_partials(d_in.data(), d_lse.data(), c.in, c.ranks, rows, d_out.data(), c.out, d_lse_out.data(), nullptr);
    const std::vector<double> got = msa::ref::read_array(d_out.download().data(), c.out, rows * 128);
    const std::vector<float> got_lse = d_lse_out.download();

    std::vector<const float*> op(c.ranks), lp(c.ranks);
    for (int r = 0; r < c.ranks; ++r) {
      op[r] = &outs[std::size_t(r) * rows * 128];
      lp[r] = &lses[std::size_t(r) * rows];
    }
    std::vector<float> want(std::size_t(rows) * 128), want_lse(static_cast<std::size_t>(rows));
    msa::cp::merge_partials(op.data(), lp.data(), c.ranks, rows, want.data(), want_lse.data());
    const double tol = c.out == msa::DType::f32 ? 1e-5 : 1.0 / 128;  // output rounding
    for (std::int64_t i = 0; i < rows * 128; ++i)
      ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << "element " << i;
    for (std::int64_t i = 0; i < rows; ++i) {
      if (want_lse[i] == -kInf) { ASSERT_EQ(got_lse[i], -kInf) << "row " << i; continue; }
      ASSERT_NEAR(got_lse[i], want_lse[i], 1e-5 * (1.0 + std::fabs(want_lse[i]))) << "row " << i;
    }

    // The same merge cut around a sum: every rank's weighted rows (e), summed
    // here in fp32 as an all-reduce would, then (f). The lse is the merge's,
    // bit for bit; NaN rows of ranks without keys stay out.
    const std::size_t per_rank = std::size_t(rows) * 128;
    std::vector<float> sum(per_rank, 0.0f);
    DeviceBuffer<float> weighted(per_rank);
    for (int r = 0; r < c.ranks; ++r) {
      weighted.poison_nan();
      cp::weigh_partial(d_in.data() + std::size_t(r) * per_rank * msa::dtype_bytes(c.in), c.in, d_lse.data(),
                        c.ranks, r, rows, weighted.data(), nullptr);
      const std::vector<float> w = weighted.download();
      for (std::size_t i = 0; i < per_rank; ++i) {
        ASSERT_FALSE(std::isnan(w[i])) << "rank " << r << " weighted element " << i;
        sum[i] += w[i];
      }
    }
    const DeviceBuffer<float> d_sum(sum);
    d_out.poison_nan();
    d_lse_out.poison_nan();
    cp::finish_weighted(d_sum.data(), d_lse.data(), c.ranks, rows, d_out.data(), c.out, d_lse_out.data(), nullptr);
    const std::vector<double> reduced = msa::ref::read_array(d_out.download().data(), c.out, rows * 128);
    for (std::int64_t i = 0; i < rows * 128; ++i)
      ASSERT_NEAR(reduced[i], want[i], tol * (1.0 + std::fabs(want[i]))) << "reduced, element " << i;
    const std::vector<float> reduced_lse = d_lse_out.download();
    ASSERT_EQ(std::memcmp(reduced_lse.data(), got_lse.data(), got_lse.size() * sizeof(float)), 0)
        << "the reduced form's lse differs from merge_partials'";
  }
}

using msa::test::expect_error;

TEST(CudaCp, ChecksNameTheArgument) {
  MSA_SKIP_WITHOUT_GPU();
  const msa::BatchMetadata meta = selection_step();
  const msa::test::DeviceStep step(meta);
  DeviceBuffer<float> scores(1024);
  DeviceBuffer<Candidate> cands(1024);
  DeviceBuffer<std::int32_t> topk(std::size_t(meta.num_tokens) * 64);
  const cp::SelectShape ok{1, 16, 0, 1, 8};
  expect_error([&] { cp::local_candidates(step.view, ok, Sharding{2, 0}, 2, scores.data(), cands.data(), nullptr); },
               "rank = 2 is not in [0, 2)");
  expect_error([&] { cp::local_candidates(step.view, {1, 65, 0, 1, 8}, Sharding{2, 0}, 0, scores.data(), cands.data(), nullptr); },
               "topk = 65");
  expect_error([&] { cp::topk_candidates(step.view, ok, Sharding{2, 0}, 0, scores.data(),
                                         TopkView::token_major(topk.data(), 1, 32), cands.data(), nullptr); },
               "own_topk.topk = 32 but topk = 16");
  expect_error([&] { cp::topk_candidates(step.view, ok, Sharding{2, 0}, 0, scores.data(),
                                         TopkView::token_major(nullptr, 1, 16), cands.data(), nullptr); },
               "cp::topk_candidates: own_topk.data is null");
  expect_error([&] { cp::topk_candidates(step.view, ok, Sharding{2, 0}, 3, scores.data(),
                                         TopkView::token_major(topk.data(), 1, 16), cands.data(), nullptr); },
               "rank = 3 is not in [0, 2)");
  expect_error([&] { cp::local_candidates(step.view, {1, 4, 3, 2, 8}, Sharding{2, 0}, 0, scores.data(), cands.data(), nullptr); },
               "init_blocks + local_blocks = 3 + 2 exceeds topk = 4");
  expect_error([&] { cp::merge_candidates(step.view, {1, 64, 0, 1, 8}, Sharding{17, 0}, cands.data(),
                                          TopkView::token_major(topk.data(), 1, 64), nullptr); },
               "num_ranks * topk = 17 * 64 = 1088 exceeds 1024");
  expect_error([&] { cp::merge_candidates(step.view, ok, Sharding{2, -1}, cands.data(),
                                          TopkView::token_major(topk.data(), 1, 16), nullptr); },
               "sharding.run_blocks = -1");
  expect_error([&] { cp::merge_partials(scores.data(), scores.data(), msa::DType::fp8_e4m3, 2, 1, topk.data(),
                                        msa::DType::bf16, nullptr, nullptr); },
               "dtype = fp8_e4m3");
  expect_error([&] { cp::weigh_partial(scores.data(), msa::DType::bf16, scores.data(), 2, 2, 1, scores.data(), nullptr); },
               "cp::weigh_partial: rank = 2 is not in [0, 2)");
  expect_error([&] { cp::weigh_partial(scores.data(), msa::DType::fp8_e5m2, scores.data(), 2, 0, 1, scores.data(), nullptr); },
               "cp::weigh_partial: dtype = fp8_e5m2");
  expect_error([&] { cp::finish_weighted(scores.data(), scores.data(), 2, 1, nullptr, msa::DType::bf16, nullptr, nullptr); },
               "cp::finish_weighted: summed / partial_lse / out is null");
  msa::AttentionArgs shape;
  shape.num_q_heads = 16, shape.cache.num_kv_heads = 1, shape.topk.topk = 32;
  expect_error([&] { (void)cp::layer_workspace_bytes(meta, ok, shape, 2); },
               "args.topk.topk = 32 but select.topk = 16");
  shape.topk.topk = 16;
  const std::size_t need = cp::layer_workspace_bytes(meta, ok, shape, 2);
  DeviceBuffer<std::uint8_t> ws(need);
  expect_error([&] { (void)cp::plan_layer(cp::Group{nullptr, 0, {2, 0}}, meta, ok, shape, {ws.data(), need - 1}, nullptr); },
               "workspace.bytes = " + std::to_string(need - 1));
  const cp::LayerPlan plan = cp::plan_layer(cp::Group{nullptr, 1, {2, 0}}, meta, ok, shape, {ws.data(), need}, nullptr);
  expect_error([&] { cp::exchange_candidates(plan, nullptr); }, "sharding.num_ranks = 2");
}

// ---- one layer, sharded ----------------------------------------------------------------

// Inputs shared by every rank: the queries and the step, on the current device.
struct DeviceQueries {
  DeviceBuffer<std::uint8_t> q, index_q;
  msa::test::DeviceStep step;
  explicit DeviceQueries(const Workload& w) : q(w.q), index_q(w.index_q), step(w.meta()) {}
};

// The attention problem of a workload (its arguments' plain fields).
msa::AttentionArgs attention_shape(Workload& w) { return w.attention_args(); }

cp::SelectShape select_shape(const Workload& w) {
  return {w.model().num_kv_heads, w.model().topk, w.model().init_blocks, w.model().local_blocks, w.max_blocks};
}

// Bytes of one page of the main cache (pages are the outermost dimension).
std::int64_t kv_page_bytes(Workload& w) {
  const msa::KVCacheView v = w.kv_view();
  return v.dtype == msa::DType::nvfp4 ? v.page_stride : v.page_stride * std::int64_t(msa::dtype_bytes(v.dtype));
}
std::int64_t index_page_bytes(Workload& w) {
  const msa::IndexCacheView v = w.index_view();
  return v.page_stride * std::int64_t(msa::dtype_bytes(v.dtype));
}

// Rank r's caches on the host: only the pages of the blocks it owns, renumbered
// in a shuffled order, plus one NaN page nobody may read; block tables with -1
// for every block of another rank.
struct ShardHost {
  std::int64_t pages = 0;
  std::vector<std::uint8_t> kv, index;
  std::vector<std::int32_t> table, index_table;
};

ShardHost make_shard(Workload& w, const Sharding& sh, int rank, std::uint64_t seed) {
  const std::int64_t kv_page = kv_page_bytes(w), ix_page = index_page_bytes(w);
  std::vector<std::pair<int, int>> owned;  // (request, block)
  for (int r = 0; r < w.num_requests(); ++r)
    for (int b = 0; b < w.meta().num_blocks(r); ++b)
      if (sh.owner(b) == rank) owned.emplace_back(r, b);
  ShardHost h;
  h.pages = std::int64_t(owned.size()) + 1;
  std::vector<std::int32_t> ids(owned.size());
  std::iota(ids.begin(), ids.end(), 1);  // page 0: the NaN page
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  h.kv.assign(std::size_t(h.pages * kv_page), 0xFF);
  h.index.assign(std::size_t(h.pages * ix_page), 0xFF);
  h.table.assign(w.block_table.size(), -1);
  h.index_table.assign(w.index_block_table.size(), -1);
  auto copy_page = [](const std::vector<std::uint8_t>& from, std::int64_t page, std::int64_t bytes,
                      std::vector<std::uint8_t>& to, std::int64_t to_page) {
    const std::int64_t at = page * bytes;
    const std::int64_t n = std::min<std::int64_t>(bytes, std::int64_t(from.size()) - at);
    std::copy_n(from.begin() + at, n, to.begin() + to_page * bytes);
  };
  for (std::size_t i = 0; i < owned.size(); ++i) {
    const auto [r, b] = owned[i];
    copy_page(w.kv_bytes, w.page(r, b), kv_page, h.kv, ids[i]);
    copy_page(w.index_bytes, w.index_page(r, b), ix_page, h.index, ids[i]);
    h.table[r * w.table_stride + b] = ids[i];
    h.index_table[r * w.table_stride + b] = ids[i];
  }
  return h;
}

// The indexer over one cache; returns the block scores it leaves in its
// workspace, [num_tokens, num_kv_heads, max_blocks]. `topk` receives its own
// selection.
DeviceBuffer<std::uint8_t> run_indexer(Workload& w, const DeviceQueries& dq, const msa::IndexCacheView& cache,
                                       const std::int32_t* table, std::int32_t* topk, void* stream) {
  const int H = w.model().num_kv_heads;
  const std::size_t bytes = msa::cuda::index_workspace_bytes(w.num_tokens(), H, w.max_blocks);
  DeviceBuffer<std::uint8_t> ws(std::max<std::size_t>(bytes, 1));
  ws.poison_nan();
  msa::IndexerArgs a = w.indexer_args();
  a.index_q = dq.index_q.data();
  a.cache = cache;
  a.block_table = w.table_at(table);
  a.out = TopkView::token_major(topk, H, w.model().topk);
  msa::cuda::index(dq.step.view, a, w.max_blocks, {ws.data(), bytes}, stream);
  return ws;
}

// Attention arguments over a cache; out and lse as given.
msa::AttentionArgs attention_args(Workload& w, const DeviceQueries& dq, const msa::KVCacheView& cache,
                                  const std::int32_t* table, void* out, float* lse) {
  msa::AttentionArgs a = w.attention_args();
  a.q = dq.q.data();
  a.cache = cache;
  a.block_table = w.table_at(table);
  a.out = out;
  a.lse = lse;
  a.topk = TopkView{};
  return a;
}

// The single-GPU layer on the current device: the indexer's top-k and scores,
// the attention's output and lse.
struct Reference {
  std::vector<std::int32_t> topk;
  std::vector<float> scores;
  std::vector<std::uint8_t> out;
  std::vector<float> lse;
};

Reference single_gpu(Workload& w) {
  const DeviceQueries dq(w);
  const DeviceBuffer<std::uint8_t> kv(w.kv_bytes), index(w.index_bytes);
  const DeviceBuffer<std::int32_t> table(w.block_table), index_table(w.index_block_table);
  DeviceBuffer<std::int32_t> topk(w.topk.size());
  topk.fill_bytes(0x7F);
  const DeviceBuffer<std::uint8_t> ws = run_indexer(w, dq, w.index_view_at(index.data()), index_table.data(), topk.data(), nullptr);
  DeviceBuffer<std::uint8_t> out(w.out.size());
  DeviceBuffer<float> lse(w.lse.size());
  out.poison_nan();
  lse.poison_nan();
  const auto shape = attention_shape(w);
  const std::size_t bytes = msa::cuda::attention_workspace_bytes(w.meta(), shape);
  DeviceBuffer<std::uint8_t> aws(std::max<std::size_t>(bytes, 1));
  const auto plan = msa::cuda::plan_attention(w.meta(), shape, {aws.data(), bytes}, nullptr);
  msa::AttentionArgs a = attention_args(w, dq, w.kv_view_at(kv.data(), nullptr, nullptr), table.data(), out.data(), lse.data());
  a.topk = TopkView::token_major(topk.data(), w.model().num_kv_heads, w.model().topk);
  msa::test::CheckBuffer check;
  msa::cuda::attend(plan, dq.step.view, a, nullptr, check.get());
  msa::test::device_sync();
  EXPECT_EQ(check.message(), "");
  Reference ref;
  ref.topk = topk.download();
  const auto raw = ws.download();
  ref.scores.resize(std::size_t(w.num_tokens()) * w.model().num_kv_heads * w.max_blocks);
  std::memcpy(ref.scores.data(), raw.data(), ref.scores.size() * sizeof(float));
  ref.out = out.download();
  ref.lse = lse.download();
  return ref;
}

// One rank's device state on the current device: its caches, its indexer
// scores, its layer plan and workspace, and its result.
struct Rank {
  DeviceQueries dq;
  DeviceBuffer<std::uint8_t> kv, index;
  DeviceBuffer<std::int32_t> table, index_table, index_topk;
  DeviceBuffer<std::uint8_t> scores;  // the indexer's workspace
  DeviceBuffer<std::uint8_t> workspace, out;
  DeviceBuffer<float> lse;
  std::int64_t pages = 0;
  cp::LayerPlan plan;
  msa::test::CheckBuffer check;

  Rank(Workload& w, const ShardHost& h, const cp::Group& group, void* stream,
       cp::PartialMerge merge = cp::PartialMerge::gather)
      : dq(w), kv(h.kv), index(h.index), table(h.table), index_table(h.index_table),
        index_topk(w.topk.size()), out(w.out.size()), lse(w.lse.size()), pages(h.pages) {
    msa::IndexCacheView ic = w.index_view_at(index.data());
    ic.num_pages = pages;
    // The blocks of other ranks are -1 in this rank's index table: the indexer
    // skips them (NaN scores); no DeviceCheck, as those entries are expected.
    scores = run_indexer(w, dq, ic, index_table.data(), index_topk.data(), stream);
    const std::size_t bytes = cp::layer_workspace_bytes(w.meta(), select_shape(w), attention_shape(w),
                                                        group.sharding.num_ranks, {}, merge);
    workspace = DeviceBuffer<std::uint8_t>(bytes);
    workspace.poison_nan();
    out.poison_nan();
    lse.poison_nan();
    plan = cp::plan_layer(group, w.meta(), select_shape(w), attention_shape(w), {workspace.data(), bytes}, stream,
                          {}, merge);
  }
  const float* score_data() const { return reinterpret_cast<const float*>(scores.data()); }
  // The indexer's own selection over this rank's cache.
  TopkView own_topk(const Workload& w) {
    return TopkView::token_major(index_topk.data(), w.model().num_kv_heads, w.model().topk);
  }
  msa::AttentionArgs args(Workload& w) {
    msa::KVCacheView c = w.kv_view_at(kv.data(), nullptr, nullptr);
    c.num_pages = pages;
    return attention_args(w, dq, c, table.data(), out.data(), lse.data());
  }
};

Workload layer_workload(msa::DType kv, std::uint64_t seed) {
  msa::WorkloadSpec spec;
  spec.model = msa::ModelConfig::minimax_m3(2);  // 32 query heads, 2 KV heads
  spec.model.num_q_heads = 8;
  spec.model.init_blocks = 1;
  spec.kv_dtype = kv;
  spec.fp8_scales = msa::ScaleMode::per_tensor;
  const int s = msa::test::size_for(1, 8);
  spec.requests = {{2, 3000 / s}, {2, 700}, {2, 20000 / s}, {2, 126}, {300 / s, 2200 / s}, {37, 0}};
  spec.decode_threshold = 2;
  spec.seed = seed;
  Workload w(spec);
  msa::cpu::insert_kv(w.kv_view(), w.insert_kv_args(), w.cpu_options());
  msa::cpu::insert_index(w.index_view(), w.insert_index_args(), w.cpu_options());
  return w;
}

// The first difference of two top-k buffers, in words ("" when equal).
std::string topk_difference(const std::vector<std::int32_t>& got, const std::vector<std::int32_t>& want, int H, int K) {
  if (got.size() != want.size()) return "sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return msa::detail::concat("topk[t=", i / (H * K), ", h=", i / K % H, ", k=", i % K, "] = ", got[i],
                                 " but the single-GPU indexer has ", want[i]);
  return "";
}

// Checks a merged layer result against the single-GPU one; prints one line.
// Each token's output row within the contract's bound.
void expect_close(const std::vector<std::uint8_t>& out, const std::vector<float>& lse, const Reference& ref,
                  msa::DType out_dtype, int num_q_heads, const std::string& what) {
  const auto n = std::int64_t(ref.out.size() / 2);
  const std::vector<double> got = msa::ref::read_array(out.data(), out_dtype, n);
  const std::vector<double> want = msa::ref::read_array(ref.out.data(), out_dtype, n);
  const msa::ref::Comparison o = msa::ref::compare_rows(got, want, std::int64_t(num_q_heads) * 128, what + " out");
  const msa::ref::Comparison l = msa::ref::compare_lse(std::vector<double>(lse.begin(), lse.end()),
                                                       std::vector<double>(ref.lse.begin(), ref.lse.end()), what + " lse");
  std::printf("[cp] %-36s rel_frob %.3e  max_abs %.3e  lse_max_abs %.3e\n", what.c_str(), o.rel_frobenius,
              o.max_abs, l.max_abs);
  EXPECT_TRUE(o.rel_ok(kOutTol)) << o.describe();
  EXPECT_TRUE(l.abs_ok(kLseTol)) << l.describe();
}

// Every rank's indexer scores agree bit for bit with the single GPU's on the
// columns the rank owns (the same keys, only on other pages).
void expect_owned_scores(Workload& w, const Rank& rank, int r, const Sharding& sh, const Reference& ref) {
  const auto raw = rank.scores.download();
  const auto* s = reinterpret_cast<const float*>(raw.data());
  const int H = w.model().num_kv_heads, M = w.max_blocks;
  for (int t = 0; t < w.num_tokens(); ++t) {
    const std::int32_t last = last_block(w.meta(), t, M);
    for (int h = 0; h < H; ++h)
      for (int b = 0; b <= last; ++b) {
        if (sh.owner(b) != r) continue;
        const std::size_t i = (std::size_t(t) * H + h) * M + b;
        if (std::memcmp(&s[i], &ref.scores[i], 4) != 0) {
          ADD_FAILURE() << "rank " << r << " score[t=" << t << ", h=" << h << ", b=" << b << "] = " << s[i]
                        << " but the single GPU has " << ref.scores[i];
          return;
        }
      }
  }
}

// Device-to-device all-gather of a per-rank slice (`bytes` at offset rank * bytes).
template <typename Get>
void copy_all_gather(std::vector<Rank*>& ranks, std::size_t bytes, Get buffer) {
  for (std::size_t dst = 0; dst < ranks.size(); ++dst)
    for (std::size_t src = 0; src < ranks.size(); ++src)
      if (src != dst)
        MSA_CUDA_CHECK(cudaMemcpy(static_cast<std::uint8_t*>(buffer(*ranks[dst])) + src * bytes,
                                  static_cast<std::uint8_t*>(buffer(*ranks[src])) + src * bytes, bytes,
                                  cudaMemcpyDeviceToDevice));
}

// N ranks on one GPU; the all-gathers are device copies.
TEST(CudaCp, ShardedLayerEqualsSingleGpu) {
  MSA_SKIP_WITHOUT_GPU();
  // from_topk: propose from each rank's own indexer top-k instead of its
  // scores; reduce: merge the partials by weighing and summing (the sum done
  // here on the host, as an all-reduce would) instead of gathering them.
  struct LCase { int ranks, run; msa::DType kv; bool from_topk, reduce; };
  const std::vector<LCase> cases = {
      {2, 0, msa::DType::bf16, false, false},    {3, 0, msa::DType::bf16, true, false},
      {4, 5, msa::DType::bf16, false, true},     {5, 0, msa::DType::fp8_e4m3, true, true},
      {3, 40, msa::DType::bf16, false, false},   {4, 5, msa::DType::bf16, true, false},
      {2, 0, msa::DType::bf16, true, true},      {1, 0, msa::DType::bf16, true, true}};
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const LCase& c = cases[ci];
    const std::uint64_t seed = msa::test::seed_for(5100 + ci);
    SCOPED_TRACE(::testing::Message() << c.ranks << " ranks, run " << c.run << ", " << msa::dtype_name(c.kv)
                                      << (c.from_topk ? ", from the own top-k" : ", from the scores")
                                      << (c.reduce ? ", reduce" : ", gather") << ", seed " << seed);
    Workload w = layer_workload(c.kv, seed);
    const Reference ref = single_gpu(w);
    const Sharding sh{c.ranks, c.run};
    const int H = w.model().num_kv_heads, K = w.model().topk;

    std::vector<std::unique_ptr<Rank>> owned_ranks;
    std::vector<Rank*> ranks;
    for (int r = 0; r < c.ranks; ++r) {
      owned_ranks.push_back(std::make_unique<Rank>(w, make_shard(w, sh, r, seed * 31 + r), cp::Group{nullptr, r, sh},
                                                   nullptr, c.reduce ? cp::PartialMerge::reduce : cp::PartialMerge::gather));
      ranks.push_back(owned_ranks.back().get());
      expect_owned_scores(w, *ranks[r], r, sh, ref);
      Rank& k = *ranks[r];
      if (c.from_topk) cp::propose(k.plan, k.dq.step.view, k.score_data(), k.own_topk(w), nullptr);
      else cp::propose(k.plan, k.dq.step.view, k.score_data(), nullptr);
    }
    const cp::LayerPlan& p0 = ranks[0]->plan;
    copy_all_gather(ranks, p0.candidate_bytes(), [](Rank& k) -> void* { return k.plan.candidates; });
    std::vector<std::int32_t> want_owned(w.topk.size());
    for (int r = 0; r < c.ranks; ++r) {
      Rank& k = *ranks[r];
      cp::merge_topk(k.plan, k.dq.step.view, nullptr);
      msa::test::device_sync();
      const auto topk = download(k.plan.topk, w.topk.size());
      ASSERT_EQ(topk_difference(topk, ref.topk, H, K), "") << "rank " << r;
      const auto mine = download(k.plan.owned, w.topk.size());
      for (std::size_t row = 0; row < w.topk.size() / K; ++row)
        msa::cp::owned_entries(&ref.topk[row * K], K, sh, r, &want_owned[row * K]);
      ASSERT_EQ(mine, want_owned) << "rank " << r << " owned entries";
      cp::attend_owned(k.plan, k.dq.step.view, k.args(w), nullptr, k.check.get());
    }
    msa::test::device_sync();
    for (int r = 0; r < c.ranks; ++r) EXPECT_EQ(ranks[r]->check.message(), "") << "rank " << r;
    const std::size_t rows = std::size_t(p0.partial_rows());
    copy_all_gather(ranks, rows * sizeof(float), [](Rank& k) -> void* { return k.plan.partial_lse; });
    if (c.reduce) {
      std::vector<float> sum(rows * 128, 0.0f);
      for (Rank* k : ranks) {
        cp::weigh_own(k->plan, nullptr);
        const std::vector<float> w_r = download(k->plan.weighted, sum.size());
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += w_r[i];
      }
      for (Rank* k : ranks)
        MSA_CUDA_CHECK(cudaMemcpy(k->plan.weighted, sum.data(), sum.size() * sizeof(float), cudaMemcpyHostToDevice));
    } else {
      copy_all_gather(ranks, rows * 128 * msa::dtype_bytes(p0.out_dtype), [](Rank& k) { return k.plan.partial_out; });
    }
    for (Rank* k : ranks) cp::combine(k->plan, k->out.data(), k->lse.data(), nullptr);
    msa::test::device_sync();
    const auto out0 = ranks[0]->out.download();
    const auto lse0 = ranks[0]->lse.download();
    expect_close(out0, lse0, ref, w.out_dtype(), w.model().num_q_heads,
                 msa::detail::concat(c.ranks, " simulated ranks, run ", c.run, " ", msa::dtype_name(c.kv),
                                     c.from_topk ? " (own top-k)" : "", c.reduce ? " reduce" : ""));
    for (int r = 1; r < c.ranks; ++r) {
      EXPECT_TRUE(ranks[r]->out.download() == out0) << "rank " << r << " merged a different output";
      EXPECT_TRUE(ranks[r]->lse.download() == lse0) << "rank " << r << " merged a different lse";
    }
  }
}

// Skips the NCCL tests where they cannot or need not run.
#define MSA_SKIP_WITHOUT_NCCL()                                                              \
  do {                                                                                       \
    MSA_SKIP_WITHOUT_GPU();                                                                  \
    if (!kHaveNccl) GTEST_SKIP() << "built without NCCL (no nccl.h / libnccl found)";       \
    if (msa::test::sanitizer_mode())                                                         \
      GTEST_SKIP() << "NCCL's own kernels are not checked under the sanitizer; the cp "      \
                      "kernels are, through ShardedLayerEqualsSingleGpu";                    \
  } while (0)

#if defined(MSA_HAVE_NCCL)
constexpr bool kHaveNccl = true;

// Makes NCCL leave NVLink multicast alone (the machines' rule) before any communicator exists.
void nccl_environment() { setenv("NCCL_NVLS_ENABLE", "0", 1); }

#define NCCL_OK(call)                                                                  \
  do {                                                                                 \
    const ncclResult_t r_ = (call);                                                    \
    ASSERT_EQ(r_, ncclSuccess) << #call << ": " << ncclGetErrorString(r_);             \
  } while (0)

// The whole NCCL path on a one-rank communicator (the only kind one GPU allows):
// identical, bit for bit, to the single-GPU indexer and attention.
TEST(CudaCp, NcclOneRankEqualsSingleGpu) {
  MSA_SKIP_WITHOUT_NCCL();
  const std::uint64_t seed = msa::test::seed_for(5200);
  MSA_TRACE_SEED(seed);
  Workload w = layer_workload(msa::DType::bf16, seed);
  const Reference ref = single_gpu(w);
  nccl_environment();
  ncclComm_t comm = nullptr;
  const int dev = 0;
  MSA_CUDA_CHECK(cudaSetDevice(dev));
  NCCL_OK(ncclCommInitAll(&comm, 1, &dev));
  cudaStream_t stream = nullptr;
  MSA_CUDA_CHECK(cudaStreamCreate(&stream));
  struct Form { bool from_topk; cp::PartialMerge merge; };
  for (const Form f : {Form{false, cp::PartialMerge::gather}, Form{true, cp::PartialMerge::gather},
                       Form{true, cp::PartialMerge::reduce}}) {
    const bool from_topk = f.from_topk;
    const bool reduce = f.merge == cp::PartialMerge::reduce;
    SCOPED_TRACE(::testing::Message() << (from_topk ? "proposed from the own top-k" : "proposed from the scores")
                                      << (reduce ? ", reduce" : ", gather"));
    const Sharding sh{1, 0};
    Rank k(w, make_shard(w, sh, 0, seed), cp::Group{comm, 0, sh}, stream, f.merge);
    if (from_topk) cp::run_layer(k.plan, k.dq.step.view, k.score_data(), k.own_topk(w), k.args(w), stream, k.check.get());
    else cp::run_layer(k.plan, k.dq.step.view, k.score_data(), k.args(w), stream, k.check.get());
    MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(k.check.message(), "");
    const auto topk = download(k.plan.topk, w.topk.size());
    EXPECT_EQ(topk_difference(topk, ref.topk, w.model().num_kv_heads, w.model().topk), "");
    EXPECT_TRUE(k.out.download() == ref.out) << "the one-rank output differs from the single-GPU attention";
    const auto lse = k.lse.download();
    EXPECT_EQ(std::memcmp(lse.data(), ref.lse.data(), lse.size() * 4), 0) << "lse differs";
    expect_close(k.out.download(), lse, ref, w.out_dtype(), w.model().num_q_heads,
                 msa::detail::concat("nccl, 1 rank", from_topk ? " (own top-k)" : "", reduce ? " reduce" : ""));

    // A plan for another group than the communicator's is refused before any transfer.
    cp::LayerPlan wrong = k.plan;
    wrong.group.sharding = Sharding{2, 0};
    expect_error([&] { cp::exchange_candidates(wrong, stream); },
                 "the communicator is rank 0 of 1 but the plan is for rank 0 of 2");
  }
  MSA_CUDA_CHECK(cudaStreamDestroy(stream));
  NCCL_OK(ncclCommDestroy(comm));
}

// Every GPU of the machine as one rank, one thread each, over NCCL.
TEST(CudaCp, NcclMultiGpuEqualsSingleGpu) {
  MSA_SKIP_WITHOUT_NCCL();
  int devices = 0;
  MSA_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2)
    GTEST_SKIP() << "needs at least 2 GPUs (this machine has " << devices
                 << "): run it on a multi-GPU machine";
  const int R = std::min(devices, 8);
  for (const int run : {0, 3}) {
    const std::uint64_t seed = msa::test::seed_for(5300 + run);
    SCOPED_TRACE(::testing::Message() << R << " GPUs, run " << run << ", seed " << seed
                                      << (run == 0 ? ", from the scores, gather" : ", from the own top-k, reduce"));
    const Sharding sh{R, run};
    MSA_CUDA_CHECK(cudaSetDevice(0));
    Workload w = layer_workload(msa::DType::bf16, seed);
    const Reference ref = single_gpu(w);
    std::vector<ShardHost> shards;
    for (int r = 0; r < R; ++r) shards.push_back(make_shard(w, sh, r, seed * 31 + r));

    nccl_environment();
    std::vector<ncclComm_t> comms(R);
    std::vector<int> devs(R);
    std::iota(devs.begin(), devs.end(), 0);
    NCCL_OK(ncclCommInitAll(comms.data(), R, devs.data()));

    std::vector<std::string> errors(R);
    std::vector<std::vector<std::int32_t>> topks(R);
    std::vector<std::vector<std::uint8_t>> outs(R);
    std::vector<std::vector<float>> lses(R);
    std::vector<std::string> checks(R);
    std::atomic<int> failed{0};
    std::barrier sync_point(R);
    auto rank_main = [&](int r) {
      std::unique_ptr<Rank> k;
      cudaStream_t stream = nullptr;
      try {  // everything that may fail before the first collective
        MSA_CUDA_CHECK(cudaSetDevice(r));
        MSA_CUDA_CHECK(cudaStreamCreate(&stream));
        k = std::make_unique<Rank>(w, shards[r], cp::Group{comms[r], r, sh}, stream,
                                   run == 0 ? cp::PartialMerge::gather : cp::PartialMerge::reduce);
        MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
      } catch (const std::exception& e) {
        errors[r] = e.what();
        failed.fetch_add(1);
      }
      sync_point.arrive_and_wait();  // no rank enters a collective unless every rank can
      if (failed.load() == 0) {
        try {
          if (run == 0) cp::run_layer(k->plan, k->dq.step.view, k->score_data(), k->args(w), stream, k->check.get());
          else cp::run_layer(k->plan, k->dq.step.view, k->score_data(), k->own_topk(w), k->args(w), stream,
                             k->check.get());
          MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
          checks[r] = k->check.message();
          topks[r] = download(k->plan.topk, w.topk.size());
          outs[r] = k->out.download();
          lses[r] = k->lse.download();
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      }
      k.reset();
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < R; ++r) threads.emplace_back(rank_main, r);
    for (auto& th : threads) th.join();
    for (int r = 0; r < R; ++r) NCCL_OK(ncclCommDestroy(comms[r]));
    MSA_CUDA_CHECK(cudaSetDevice(0));

    for (int r = 0; r < R; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
    for (int r = 0; r < R; ++r) {
      EXPECT_EQ(checks[r], "") << "rank " << r;
      EXPECT_EQ(topk_difference(topks[r], ref.topk, w.model().num_kv_heads, w.model().topk), "") << "rank " << r;
      EXPECT_TRUE(outs[r] == outs[0] && lses[r] == lses[0]) << "rank " << r << " merged a different result";
    }
    expect_close(outs[0], lses[0], ref, w.out_dtype(), w.model().num_q_heads, msa::detail::concat("nccl, ", R, " GPUs, run ", run));
  }
}

#else  // no NCCL in this build: the NCCL tests only report it.
constexpr bool kHaveNccl = false;
TEST(CudaCp, NcclOneRankEqualsSingleGpu) { MSA_SKIP_WITHOUT_NCCL(); }
TEST(CudaCp, NcclMultiGpuEqualsSingleGpu) { MSA_SKIP_WITHOUT_NCCL(); }
#endif  // MSA_HAVE_NCCL

}  // namespace
