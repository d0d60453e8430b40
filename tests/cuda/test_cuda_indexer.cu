// GPU indexer against the CPU engine:
//  - block scores within 1e-3 relative of cpu::block_scores, -inf in the same
//    places (fp32 on tensor cores vs fp32 FMA chains: close, not identical);
//  - the GPU top-k bit-identical to cpu::select_row applied to the GPU's own
//    scores, for every row;
//  - the GPU top-k equal to cpu::index wherever the selection boundary is
//    well separated (gap above the score tolerance);
//  - select_topk() alone on adversarial scores (ties, NaN, -inf, +-0);
//  - a bad index block-table entry skipped and recorded by the DeviceCheck.
// Prefill, decode, verify (decode_query_len 2 to 4) and padding rows; topk
// 1/16/64, init 0/1, local 1/2; bf16/fp16 queries with bf16, fp8 e4m3 or nvfp4
// keys (global scales a power of two and not), fp8 e4m3 queries with fp8 keys;
// shuffled pages; keys that tie every block of a request.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/cuda.hpp"
#include "msa/numeric.hpp"

namespace {

using msa::DType;
using msa::kBlockSize;
using msa::kHeadDim;
using msa::test::DeviceBuffer;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPoisonKey = 256.0f;  // keys nobody may read: a huge dot if read

struct Shape {
  std::vector<std::int32_t> query_lens;
  std::vector<std::int32_t> seq_lens;  // 0: padding request
  std::int32_t decode_threshold = 1;
  int heads = 1;
  int topk = 16, init = 0, local = 1;
  DType iq = DType::bf16;             // bf16, fp16, or fp8_e4m3 (fp8 keys only)
  DType keys = DType::bf16;           // bf16, fp8_e4m3 or nvfp4
  float global_scale = 1.0f / 64.0f;  // nvfp4 keys: the cache's global scale
  std::uint64_t seed = 1;
  std::int64_t spare_pages = 5;
  std::int64_t shared_pool = 0;  // > 0: tables point into a pool of this many pages (no data check)
  bool head_major = false;       // write the top-k through a [kv_head, token, topk] view
  bool ties = false;             // every key of a request the same: all its blocks score alike
  bool widen_room = false;       // nvfp4: a workspace with room to widen the prefill keys ahead
  std::string name() const {
    std::string s = msa::detail::concat("H=", heads, " topk=", topk, " init=", init, " local=", local,
                                        " iq=", msa::dtype_name(iq), " keys=", msa::dtype_name(keys));
    if (keys == DType::nvfp4) s += msa::detail::concat(" global_scale=", global_scale);
    if (ties) s += " ties";
    if (widen_room) s += " widen_room";
    s += msa::detail::concat(" seed=", seed, " requests(q/seq)=");
    for (std::size_t r = 0; r < query_lens.size(); ++r)
      s += msa::detail::concat(r ? "," : "", query_lens[r], "/", seq_lens[r]);
    return s;
  }
};

// Host inputs of one indexer call.
struct Problem {
  Shape shape;
  msa::BatchMetadata meta;
  std::int64_t num_pages = 0;
  std::vector<std::uint8_t> cache;  // [num_pages, 128, 128] of shape.keys
  std::int32_t max_blocks = 0;
  std::int64_t table_stride = 0;
  std::vector<std::int32_t> table;  // [num_requests, table_stride]
  std::vector<std::uint8_t> iq;     // [num_tokens, heads, 128] of shape.iq (2 or 1 bytes each)

  msa::IndexerArgs args(void* iq_at, void* cache_at, const std::int32_t* table_at,
                        std::int32_t* out_at) const {
    msa::IndexerArgs a;
    a.index_q = iq_at;
    a.iq_dtype = shape.iq;
    a.num_kv_heads = shape.heads;
    a.init_blocks = shape.init;
    a.local_blocks = shape.local;
    a.cache = msa::make_index_cache_view(shape.keys, cache_at, num_pages, 0,
                                         shape.keys == DType::nvfp4 ? shape.global_scale : 1.0f);
    a.block_table = msa::BlockTable{table_at, meta.num_requests, max_blocks, table_stride};
    a.out = msa::TopkView::token_major(out_at, shape.heads, shape.topk);
    return a;
  }
};

// Token j of page `page` gets the 128 features `x`, stored as the cache's dtype
// (nvfp4: quantized in groups of 16 with the cache's global scale).
void put_key_row(Problem& pb, std::int64_t page, std::int64_t j, const float* x) {
  const DType dt = pb.shape.keys;
  if (dt == DType::nvfp4) {
    std::uint8_t* row = pb.cache.data() + page * msa::index_nvfp4::kPageBytes + j * msa::index_nvfp4::kRowBytes;
    for (int grp = 0; grp < kHeadDim / 16; ++grp) {
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * grp + i]));
      const std::uint8_t sf = msa::num::nvfp4_group_scale(amax, pb.shape.global_scale);
      row[msa::index_nvfp4::kDataBytes + grp] = sf;
      for (int i = 0; i < 16; i += 2) {
        const std::uint8_t lo = msa::num::nvfp4_encode(x[16 * grp + i], sf, pb.shape.global_scale);
        const std::uint8_t hi = msa::num::nvfp4_encode(x[16 * grp + i + 1], sf, pb.shape.global_scale);
        row[(16 * grp + i) / 2] = std::uint8_t(lo | (hi << 4));
      }
    }
    return;
  }
  const std::int64_t base = (page * kBlockSize + j) * kHeadDim;
  for (int d = 0; d < kHeadDim; ++d) {
    if (dt == DType::bf16) reinterpret_cast<std::uint16_t*>(pb.cache.data())[base + d] = msa::num::float_to_bf16(x[d]);
    else pb.cache[std::size_t(base + d)] = msa::num::float_to_e4m3(x[d]);
  }
}

Problem make_problem(const Shape& shape) {
  Problem pb;
  pb.shape = shape;
  msa::BatchSpec spec;
  spec.query_lens = shape.query_lens;
  spec.seq_lens = shape.seq_lens;
  spec.decode_threshold = shape.decode_threshold;
  pb.meta = msa::build_metadata(spec);
  std::mt19937_64 rng(shape.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  const std::int32_t R = pb.meta.num_requests;
  std::int64_t used = 0;
  for (std::int32_t r = 0; r < R; ++r) {
    pb.max_blocks = std::max(pb.max_blocks, pb.meta.num_blocks(r));
    used += pb.meta.num_blocks(r);
  }
  pb.table_stride = pb.max_blocks + 3;
  pb.num_pages = shape.shared_pool > 0 ? shape.shared_pool : used + shape.spare_pages;
  pb.cache.assign(std::size_t(pb.num_pages * msa::index_page_bytes(shape.keys)), 0);
  pb.table.assign(std::size_t(R) * pb.table_stride, -1);

  // Pages: a shuffled pool, or random picks from a shared pool (timing only).
  std::vector<std::int32_t> perm(pb.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::int64_t next = 0;
  for (std::int32_t r = 0; r < R; ++r) {
    for (std::int32_t b = 0; b < pb.meta.num_blocks(r); ++b) {
      pb.table[r * pb.table_stride + b] =
          shape.shared_pool > 0 ? std::int32_t(rng() % pb.num_pages) : perm[next++];
    }
  }
  // Every key poisoned, then the keys of each request written.
  float row[kHeadDim];
  for (std::int64_t page = 0; page < pb.num_pages; ++page) {
    for (std::int64_t j = 0; j < kBlockSize; ++j) {
      for (float& x : row) x = shape.shared_pool > 0 ? normal(rng) : kPoisonKey;
      put_key_row(pb, page, j, row);
    }
  }
  if (shape.shared_pool == 0) {
    for (std::int32_t r = 0; r < R; ++r) {
      if (shape.ties) {
        for (float& x : row) x = normal(rng);
      }
      for (std::int32_t j = 0; j < pb.meta.seq_lens[r]; ++j) {
        if (!shape.ties) {
          for (float& x : row) x = normal(rng);
        }
        put_key_row(pb, pb.table[r * pb.table_stride + j / kBlockSize], j % kBlockSize, row);
      }
    }
  }
  const std::size_t qb = msa::dtype_bytes(shape.iq);
  pb.iq.resize(std::size_t(pb.meta.num_tokens) * shape.heads * kHeadDim * qb);
  for (std::size_t i = 0; i < pb.iq.size() / qb; ++i) {
    const float v = normal(rng);
    if (shape.iq == DType::fp8_e4m3) {
      pb.iq[i] = msa::num::float_to_e4m3(v);
    } else {
      const std::uint16_t h = shape.iq == DType::bf16 ? msa::num::float_to_bf16(v) : msa::num::float_to_fp16(v);
      std::memcpy(pb.iq.data() + 2 * i, &h, 2);
    }
  }
  return pb;
}

// Device copies of a problem, the output and the workspace (NaN-poisoned).
struct DeviceProblem {
  msa::test::DeviceStep step;
  DeviceBuffer<std::uint8_t> cache;
  DeviceBuffer<std::int32_t> table;
  DeviceBuffer<std::uint8_t> iq;
  DeviceBuffer<std::int32_t> topk;
  DeviceBuffer<std::uint8_t> workspace;
  std::size_t workspace_bytes = 0;
  msa::IndexerArgs args;

  explicit DeviceProblem(const Problem& pb)
      : step(pb.meta), cache(pb.cache), table(pb.table), iq(pb.iq),
        topk(std::size_t(pb.meta.num_tokens) * pb.shape.heads * pb.shape.topk) {
    workspace_bytes = msa::cuda::index_workspace_bytes(pb.meta.num_tokens, pb.shape.heads, pb.max_blocks,
                                                       pb.shape.keys, pb.shape.widen_room ? pb.meta.num_prefills : 0);
    workspace = DeviceBuffer<std::uint8_t>(workspace_bytes);
    workspace.poison_nan();
    topk.fill_bytes(0x7F);  // 0x7F7F7F7F: neither -1 nor a block id
    args = pb.args(iq.data(), cache.data(), table.data(), topk.data());
    if (pb.shape.head_major) {
      args.out.token_stride = pb.shape.topk;
      args.out.head_stride = std::int64_t(pb.meta.num_tokens) * pb.shape.topk;
    }
  }
  void run(const Problem& pb, const msa::cuda::DeviceCheck& check = {}, cudaStream_t stream = nullptr) {
    msa::cuda::index(step.view, args, pb.max_blocks, {workspace.data(), workspace_bytes}, stream, check);
  }
  // The top-k as token-major [num_tokens, H, topk], whatever view was written.
  std::vector<std::int32_t> topk_token_major(const Problem& pb) const {
    const std::vector<std::int32_t> raw = topk.download();
    std::vector<std::int32_t> out(raw.size());
    const std::int64_t H = pb.shape.heads, K = pb.shape.topk;
    for (std::int64_t t = 0; t < pb.meta.num_tokens; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t k = 0; k < K; ++k)
          out[(t * H + h) * K + k] = raw[t * args.out.token_stride + h * args.out.head_stride + k];
    return out;
  }
  std::vector<float> scores(const Problem& pb) const {
    std::vector<float> s(std::size_t(pb.meta.num_tokens) * pb.shape.heads * pb.max_blocks);
    if (!s.empty())
      MSA_CUDA_CHECK(cudaMemcpy(s.data(), workspace.data(), s.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return s;
  }
};

std::int32_t last_block(const Problem& pb, std::int32_t t) {
  const std::int32_t p = pb.meta.token_position[t];
  return p < 0 ? -1 : p / kBlockSize;
}

// Whether the candidates' pick-th and (pick+1)-th best CPU scores differ by more
// than the score tolerance (so GPU and CPU must select the same blocks).
bool well_separated(const float* s, std::int32_t last, const Shape& sh, double tol) {
  const std::int32_t n = last + 1;
  if (n <= sh.topk) return true;
  const std::int32_t pick = sh.topk - sh.init - sh.local;
  if (pick <= 0) return true;
  std::vector<float> c(s + sh.init, s + n - sh.local);
  std::sort(c.begin(), c.end(), [](float a, float b) { return a > b; });
  if (std::size_t(pick) >= c.size()) return true;
  return double(c[pick - 1]) - double(c[pick]) > tol * (1.0 + std::fabs(double(c[pick - 1])));
}

constexpr double kScoreTol = 1e-3;
// fp8 queries on an fp8 cache: the prefill tiles multiply on fp8 tensor cores,
// whose accumulation keeps fewer bits than fp32 (scores within 4e-3 relative).
double score_tol(const Shape& sh) { return sh.iq == DType::fp8_e4m3 ? 4e-3 : kScoreTol; }
// The gap above which GPU and CPU must pick the same blocks: well above the GPU's error.
double separation(const Shape& sh) { return sh.iq == DType::fp8_e4m3 ? 2.0 * score_tol(sh) : 0.1 * kScoreTol; }

// The device's scores and selection (from its last run) against the CPU
// engine's; `separated`: most rows must have a well-separated boundary.
void expect_matches_cpu(const Shape& sh, const Problem& pb, const DeviceProblem& dev, bool separated = true) {
  const std::vector<float> gpu = dev.scores(pb);
  const std::vector<std::int32_t> topk = dev.topk_token_major(pb);

  // Scores against cpu::block_scores.
  const std::int64_t H = sh.heads, MB = pb.max_blocks, K = sh.topk;
  std::vector<float> cpu(gpu.size(), std::numeric_limits<float>::quiet_NaN());
  msa::IndexerArgs host_args = pb.args(const_cast<std::uint8_t*>(pb.iq.data()),
                                       const_cast<std::uint8_t*>(pb.cache.data()), pb.table.data(), nullptr);
  msa::cpu::block_scores(pb.meta.view(), host_args, cpu.data(), pb.max_blocks);
  double worst = 0.0;
  std::int64_t worst_at = -1, bad = 0, first_bad = -1;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    const float g = gpu[i], c = cpu[i];
    if (std::isinf(c) || std::isinf(g) || std::isnan(c) || std::isnan(g)) {
      const bool same = (std::isnan(c) && std::isnan(g)) || g == c;
      if (!same && bad++ == 0) first_bad = std::int64_t(i);
      continue;
    }
    const double err = std::fabs(double(g) - double(c)) / (1.0 + std::fabs(double(c)));
    if (err > worst) {
      worst = err;
      worst_at = std::int64_t(i);
    }
  }
  EXPECT_EQ(bad, 0) << "non-finite placement differs first at score " << first_bad << " (row "
                    << first_bad / std::max<std::int64_t>(MB, 1) << ", block " << first_bad % std::max<std::int64_t>(MB, 1)
                    << "): gpu " << (first_bad >= 0 ? gpu[first_bad] : 0.f) << " cpu "
                    << (first_bad >= 0 ? cpu[first_bad] : 0.f);
  EXPECT_LE(worst, score_tol(sh)) << "worst score at " << worst_at << ": gpu " << gpu[worst_at] << " cpu "
                              << cpu[worst_at];
  std::printf("[ scores ] %s: %zu scores, worst rel err %.3g\n", sh.name().c_str(), gpu.size(), worst);

  // Selection: bit-identical to cpu::select_row on the GPU's own scores.
  std::vector<std::int32_t> want(K);
  std::int64_t mismatched_rows = 0;
  for (std::int32_t t = 0; t < pb.meta.num_tokens; ++t) {
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t row = t * H + h;
      msa::cpu::select_row(gpu.data() + row * MB, last_block(pb, t), sh.topk, sh.init, sh.local,
                           want.data());
      const std::int32_t* got = topk.data() + row * K;
      if (!std::equal(want.begin(), want.end(), got) && mismatched_rows++ == 0) {
        std::string g, w;
        for (std::int64_t k = 0; k < K; ++k) {
          g += msa::detail::concat(got[k], " ");
          w += msa::detail::concat(want[k], " ");
        }
        ADD_FAILURE() << "topk row t=" << t << " h=" << h << " (last block " << last_block(pb, t)
                      << ") got [" << g << "] want [" << w << "]";
      }
    }
  }
  EXPECT_EQ(mismatched_rows, 0);

  // Agreement with cpu::index where the selection boundary is well separated.
  std::vector<std::int32_t> cpu_topk(topk.size(), -7);
  host_args.out = msa::TopkView::token_major(cpu_topk.data(), sh.heads, sh.topk);
  msa::cpu::index(pb.meta.view(), host_args);
  std::int64_t compared = 0, differ = 0;
  for (std::int64_t row = 0; row < std::int64_t(pb.meta.num_tokens) * H; ++row) {
    const std::int32_t t = std::int32_t(row / H);
    if (!well_separated(cpu.data() + row * MB, last_block(pb, t), sh, separation(sh))) continue;
    ++compared;
    if (!std::equal(cpu_topk.begin() + row * K, cpu_topk.begin() + (row + 1) * K, topk.begin() + row * K)) {
      if (differ++ == 0) ADD_FAILURE() << "cpu::index differs on well-separated row " << row;
    }
  }
  EXPECT_EQ(differ, 0);
  // (fp8 scores need a wider gap, which fewer rows have: 16% of the rows at
  // topk 64 on the H200; tied blocks have none.)
  const std::int64_t tenths = sh.iq == DType::fp8_e4m3 ? 1 : 8;
  if (separated && !sh.ties) {
    EXPECT_GE(compared, std::int64_t(pb.meta.num_tokens) * H * tenths / 10) << "too few well-separated rows";
  }
}

// Runs one shape through cuda::index and checks scores and selection, then
// `more` (if given) on the same run.
void check_shape(const Shape& sh,
                 const std::function<void(const Problem&, const DeviceProblem&)>& more = nullptr) {
  SCOPED_TRACE(sh.name());
  const Problem pb = make_problem(sh);
  DeviceProblem dev(pb);
  msa::test::CheckBuffer check;
  dev.run(pb, check.get());
  msa::test::device_sync();
  EXPECT_EQ(check.message(), "");
  expect_matches_cpu(sh, pb, dev);
  if (more) more(pb, dev);
}

TEST(CudaIndexer, PrefillChunks) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(11);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int heads : {1, 2, 4}) {
    Shape sh;
    // A fresh prompt, a chunk after cached context, a 1-token prefill, a chunk
    // that starts mid-block.
    sh.query_lens = {small ? 130 : 600, small ? 40 : 333, 1, small ? 9 : 129};
    sh.seq_lens = {sh.query_lens[0], small ? 300 : 2500, small ? 200 : 1800, small ? 150 : 1100};
    sh.decode_threshold = 0;
    sh.heads = heads;
    sh.iq = heads == 2 ? DType::fp16 : DType::bf16;
    sh.keys = heads == 4 ? DType::fp8_e4m3 : DType::bf16;
    sh.seed = s++;
    check_shape(sh);
  }
}

TEST(CudaIndexer, DecodeVerifyAndPadding) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(22);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int dql : {1, 2}) {
    for (DType keys : {DType::bf16, DType::fp8_e4m3}) {
      Shape sh;
      sh.decode_threshold = dql;
      // Decodes (one a padding request), then a prefill, then a padding prefill.
      sh.query_lens = {dql, dql, dql, dql, dql, dql, 37, 5};
      sh.seq_lens = {dql, 127, 128 + dql - 1, 0, 129, small ? 700 : 5000, small ? 300 : 3000, 0};
      sh.heads = dql == 1 ? 4 : 2;
      sh.keys = keys;
      sh.iq = keys == DType::bf16 && dql == 2 ? DType::fp16 : DType::bf16;
      sh.head_major = keys == DType::fp8_e4m3;
      sh.seed = s++;
      check_shape(sh);
    }
  }
}

// The fp8 index: e4m3 queries on an e4m3 cache (fp8 tensor cores) in prefill
// tiles, decodes and verifies.
TEST(CudaIndexer, Fp8QueryOnFp8Cache) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(55);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int dql : {1, 3}) {
    for (int heads : {1, 4}) {
      Shape sh;
      sh.decode_threshold = dql;
      sh.query_lens = {dql, dql, dql, small ? 70 : 333, 4, small ? 40 : 129};
      sh.seq_lens = {small ? 900 : 7000, dql, 0, small ? 500 : 2500, small ? 300 : 1800, small ? 40 : 129};
      sh.heads = heads;
      sh.iq = DType::fp8_e4m3;
      sh.keys = DType::fp8_e4m3;
      sh.seed = s++;
      check_shape(sh);
    }
  }
}

// nvfp4 index caches with bf16 and fp16 queries: decode and verify rows.
TEST(CudaIndexer, Nvfp4CacheDecodeVerify) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(66);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int dql : {1, 2, 4}) {
    Shape sh;
    sh.decode_threshold = dql;
    sh.query_lens = {dql, dql, dql, dql, dql};
    sh.seq_lens = {dql, 127 + dql, 0, small ? 1000 : 9000, small ? 600 : 3000};
    sh.heads = dql == 4 ? 4 : 2;
    sh.iq = dql == 2 ? DType::fp16 : DType::bf16;
    sh.keys = DType::nvfp4;
    sh.seed = s++;
    check_shape(sh);
  }
}

// Workspace sizing (host only, no device needed): the scores, plus for an
// nvfp4 cache the room to widen the prefill requests' keys ahead.
TEST(CudaIndexer, WorkspaceBytesWithRoomToWiden) {
  const std::size_t scores = msa::cuda::index_workspace_bytes(4096, 2, 100);
  EXPECT_EQ(scores, std::size_t(4096) * 2 * 100 * 4);
  for (DType d : {DType::bf16, DType::fp8_e4m3})
    EXPECT_EQ(msa::cuda::index_workspace_bytes(4096, 2, 100, d, 3), scores) << msa::dtype_name(d);
  EXPECT_EQ(msa::cuda::index_workspace_bytes(4096, 2, 100, DType::nvfp4, 3),
            scores + std::size_t(3) * 100 * kBlockSize * kHeadDim * 2);
  EXPECT_EQ(msa::cuda::index_workspace_bytes(4096, 2, 100, DType::nvfp4, 0), scores);
  EXPECT_THROW(msa::cuda::index_workspace_bytes(4096, 2, 100, DType::nvfp4, -1), msa::Error);
}

// Decode units: a request of one full unit (32 rows) and of more rows than one
// unit (48), one long request spread over every SM, and many short ones.
TEST(CudaIndexer, DecodeUnitsAndSpread) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(77);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int dql : {2, 3}) {
    for (DType keys : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
      Shape sh;
      sh.decode_threshold = dql;
      sh.query_lens = {dql, dql, dql};
      sh.seq_lens = {small ? 4000 : 40000, dql, small ? 500 : 2000};
      sh.heads = 16;  // 32 rows per request: one full unit; 48: two units of 24
      sh.keys = keys;
      sh.iq = keys == DType::fp8_e4m3 ? DType::fp8_e4m3 : DType::bf16;
      sh.seed = s++;
      check_shape(sh);
    }
  }
  Shape many;
  many.decode_threshold = 1;
  for (int r = 0; r < (small ? 40 : 300); ++r) {
    many.query_lens.push_back(1);
    many.seq_lens.push_back(1 + int((r * 7919) % (small ? 700 : 3000)));
  }
  many.heads = 1;
  many.seed = s++;
  check_shape(many);
}

// Prefill tiles: several 256-row tiles per request with H = 1, 2, 4, a fresh
// prompt (tiles of the first blocks see few blocks), tiles ending mid-request;
// nvfp4 keys with bf16 and fp16 queries (widened in the wgmma kernel).
TEST(CudaIndexer, PrefillTiles) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(88);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int heads : {1, 2, 4}) {
    for (DType keys : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
      Shape sh;
      sh.decode_threshold = 1;
      sh.query_lens = {1, small ? 300 : 1100, small ? 200 : 777, 3};
      sh.seq_lens = {small ? 2000 : 5000, small ? 300 : 1100, small ? 900 : 6000, small ? 130 : 4099};
      sh.heads = heads;
      sh.keys = keys;
      sh.iq = keys != DType::nvfp4 ? keys : heads == 2 ? DType::fp16 : DType::bf16;
      sh.global_scale = heads == 4 ? 0.0173f : 1.0f / 64.0f;
      sh.seed = s++;
      check_shape(sh);
    }
  }
}

TEST(CudaIndexer, TopkInitLocalVariants) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(33);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  struct V {
    int topk, init, local;
  };
  for (V v : {V{1, 0, 1}, V{1, 0, 0}, V{16, 1, 1}, V{16, 0, 2}, V{16, 1, 2}, V{64, 0, 1}, V{64, 1, 2}}) {
    Shape sh;
    sh.decode_threshold = 1;
    sh.query_lens = {1, 1, 1, small ? 50 : 200};
    sh.seq_lens = {small ? 3000 : 9000, 64 * 128 + 1, 300, small ? 1000 : 12000};
    sh.heads = 2;
    sh.topk = v.topk;
    sh.init = v.init;
    sh.local = v.local;
    sh.seed = s++;
    check_shape(sh);
  }
}

// ---- lower-precision index caches: nvfp4 keys, fp8 queries -------------------------

// nvfp4 keys (72-byte rows: e2m1 codes, e4m3 group scales, a global scale) with
// bf16 / fp16 queries in prefill chunks (a fresh prompt, chunks after cached
// context and starting mid-block, a 1-token prefill) for H = 1, 2, 4, and in a
// mixed step (decodes, a padding decode, a prefill, a padding prefill).
TEST(CudaIndexer, Nvfp4KeysPrefillChunks) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(71);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int heads : {1, 2, 4}) {
    Shape sh;
    sh.query_lens = {small ? 130 : 600, small ? 40 : 333, 1, small ? 9 : 129};
    sh.seq_lens = {sh.query_lens[0], small ? 300 : 2500, small ? 200 : 1800, small ? 150 : 1100};
    sh.decode_threshold = 0;
    sh.heads = heads;
    sh.iq = heads == 2 ? DType::fp16 : DType::bf16;
    sh.keys = DType::nvfp4;
    sh.global_scale = heads == 4 ? 0.0173f : 1.0f / 64.0f;  // a power of two, and not
    sh.seed = s++;
    check_shape(sh);
  }
  Shape mixed;
  mixed.decode_threshold = 2;
  mixed.query_lens = {2, 2, 2, 37, 5};
  mixed.seq_lens = {small ? 700 : 5000, 0, 129, small ? 300 : 3000, 0};
  mixed.heads = 2;
  mixed.keys = DType::nvfp4;
  mixed.global_scale = 0.0173f;
  mixed.seed = s++;
  check_shape(mixed);
}

// nvfp4 keys widened once ahead into the workspace (prefill chunks of 2048 rows
// or more a request on average, a workspace sized for it): fresh prompts,
// chunks after cached context, a 2-token and a padding prefill, a decode in
// the same step, H = 1, 2, 4, bf16 and fp16 queries. The first prefill
// request's block 0 must have been widened (no poison left in its slot).
TEST(CudaIndexer, Nvfp4KeysWidenedAhead) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(73);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int heads : {1, 2, 4}) {
    for (DType iq : {DType::bf16, DType::fp16}) {
      Shape sh;
      sh.decode_threshold = 1;
      // 2048 prefill rows a prefill request or more: at H = 1 one long chunk
      // and a padding prefill.
      if (heads == 1) {
        sh.query_lens = {1, 4300, 5};
        sh.seq_lens = {small ? 900 : 3000, 4500, 0};
      } else {
        sh.query_lens = {1, 3000, 1100, 2, 5};
        sh.seq_lens = {small ? 900 : 3000, 3000, small ? 1500 : 6000, small ? 0 : 4099, 0};
      }
      sh.heads = heads;
      sh.keys = DType::nvfp4;
      sh.iq = iq;
      sh.global_scale = heads == 2 ? 1.0f / 64.0f : 0.0173f;
      sh.widen_room = true;
      sh.seed = s++;
      check_shape(sh, [](const Problem& pb, const DeviceProblem& dev) {
        const std::size_t at = msa::cuda::index_workspace_bytes(pb.meta.num_tokens, pb.shape.heads, pb.max_blocks);
        ASSERT_GE(dev.workspace_bytes, at + 32768);
        std::vector<std::uint16_t> slot(16384);
        MSA_CUDA_CHECK(cudaMemcpy(slot.data(), dev.workspace.data() + at, 32768, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::count(slot.begin(), slot.end(), std::uint16_t(0xFFFF)), 0) << "block 0 not widened ahead";
      });
    }
  }
}

// nvfp4 keys, decode and verify rows only (decode_query_len 1, 2, 4): padding
// requests, partial last blocks (127, 128 + q - 1, 129 tokens), a global scale
// that is not a power of two, a head-major top-k view.
TEST(CudaIndexer, Nvfp4KeysDecodePartialBlocksAndScales) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(72);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int dql : {1, 2, 4}) {
    Shape sh;
    sh.decode_threshold = dql;
    sh.query_lens = {dql, dql, dql, dql, dql, dql};
    sh.seq_lens = {dql, 127, 128 + dql - 1, 0, 129, small ? 700 : 5000};
    sh.heads = dql == 1 ? 4 : (dql == 2 ? 1 : 2);
    sh.keys = DType::nvfp4;
    sh.iq = dql == 2 ? DType::fp16 : DType::bf16;
    sh.global_scale = dql == 2 ? 1.0f / 256.0f : 0.0173f;
    sh.head_major = dql == 2;
    sh.seed = s++;
    check_shape(sh);
  }
}

// nvfp4 keys in units of one row (one decode token, one KV head: seven of the
// MMA's eight columns hold no row): padding requests, partial last blocks, a
// global scale that is not a power of two, bf16 and fp16 queries, and every
// key of a request alike (ties).
TEST(CudaIndexer, Nvfp4KeysOneRowUnits) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(78);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (DType iq : {DType::bf16, DType::fp16}) {
    for (bool ties : {false, true}) {
      Shape sh;
      sh.query_lens = {1, 1, 1, 1, 1, 1, 1};
      sh.seq_lens = {1, 127, 128, 0, 129, small ? 700 : 5000, small ? 300 : 9000};
      sh.heads = 1;
      sh.keys = DType::nvfp4;
      sh.iq = iq;
      sh.global_scale = iq == DType::fp16 ? 1.0f / 256.0f : 0.0173f;
      sh.ties = ties;
      sh.seed = s++;
      check_shape(sh);
    }
  }
}

// fp8 e4m3 queries on an fp8 cache: verify rows of 2 and 4 tokens with padding
// requests and partial last blocks, through a head-major top-k view.
TEST(CudaIndexer, Fp8QueriesVerifyHeadMajor) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(74);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  for (int dql : {2, 4}) {
    Shape sh;
    sh.decode_threshold = dql;
    sh.query_lens = {dql, dql, dql, dql, dql, dql, 37, 5};
    sh.seq_lens = {dql, 127, 128 + dql - 1, 0, 129, small ? 700 : 5000, small ? 300 : 3000, 0};
    sh.heads = dql == 2 ? 2 : 1;
    sh.iq = DType::fp8_e4m3;
    sh.keys = DType::fp8_e4m3;
    sh.head_major = true;
    sh.seed = s++;
    check_shape(sh);
  }
}

// Top-k, init and local variants on the lower-precision caches (decode rows for
// nvfp4, a prefill too for fp8).
TEST(CudaIndexer, LowPrecisionTopkInitLocalVariants) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(75);
  MSA_TRACE_SEED(seed);
  const bool small = msa::test::sanitizer_mode();
  std::uint64_t s = seed;
  struct V {
    int topk, init, local;
  };
  for (DType keys : {DType::nvfp4, DType::fp8_e4m3}) {
    for (V v : {V{1, 0, 1}, V{16, 1, 2}, V{64, 0, 1}}) {
      Shape sh;
      sh.decode_threshold = 1;
      sh.query_lens = {1, 1, 1};
      sh.seq_lens = {small ? 3000 : 9000, 64 * 128 + 1, 300};
      if (keys == DType::fp8_e4m3) {
        sh.query_lens.push_back(small ? 50 : 200);
        sh.seq_lens.push_back(small ? 1000 : 12000);
      }
      sh.heads = 2;
      sh.topk = v.topk;
      sh.init = v.init;
      sh.local = v.local;
      sh.keys = keys;
      sh.iq = keys == DType::fp8_e4m3 ? DType::fp8_e4m3 : DType::bf16;
      sh.seed = s++;
      check_shape(sh);
    }
  }
}

// Every key of a request the same vector: all its blocks score alike (the
// partial last block too), so the selection is decided by the tie rule alone
// (lower block ids first), on every key dtype and query dtype.
TEST(CudaIndexer, TiedBlocksOnEveryKeyDtype) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(76);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  struct D {
    DType keys, iq;
  };
  for (D d : {D{DType::bf16, DType::bf16}, D{DType::fp8_e4m3, DType::fp16}, D{DType::fp8_e4m3, DType::fp8_e4m3},
              D{DType::nvfp4, DType::bf16}, D{DType::nvfp4, DType::fp16}}) {
    Shape sh;
    sh.decode_threshold = 2;
    sh.query_lens = {2, 2, 2, 70};
    sh.seq_lens = {3000, 0, 2100, 1500};
    sh.heads = 2;
    sh.keys = d.keys;
    sh.iq = d.iq;
    sh.ties = true;
    sh.seed = s++;
    check_shape(sh);
  }
}

// How check_select_on_adversarial_scores draws scores. adversarial: NaN,
// infinities, signed zeros, heavy ties and N(0, 10) mixed. runs: N(0, 1) with
// a few runs of 1-8 neighbouring blocks scoring high and tied (10, 11 or 12),
// so that the winners share lanes as a model indexer's do, the threshold's
// ties among them; every seventh row -inf outside its runs.
enum class ScorePattern { adversarial, runs };

// select_topk on drawn scores against cpu::select_row, for decode / verify
// rows of the given sequence lengths (every fifth request verifies 3 tokens)
// and H = 3 heads.
void check_select_on_adversarial_scores(const std::vector<int>& seq_lens, std::mt19937_64& rng,
                                        ScorePattern pattern = ScorePattern::adversarial) {
  msa::BatchSpec spec;
  spec.decode_threshold = 1;
  const int num_req = int(seq_lens.size());
  for (int r = 0; r < num_req; ++r) {
    spec.query_lens.push_back(r % 5 == 4 ? 3 : 1);
    spec.seq_lens.push_back(seq_lens[std::size_t(r)]);
  }
  // decodes first: sort by query length
  std::vector<int> order(num_req);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return spec.query_lens[a] < spec.query_lens[b]; });
  msa::BatchSpec sorted = spec;
  for (int i = 0; i < num_req; ++i) {
    sorted.query_lens[i] = spec.query_lens[order[i]];
    sorted.seq_lens[i] = std::max(spec.seq_lens[order[i]], sorted.query_lens[i]);
  }
  const msa::BatchMetadata meta = msa::build_metadata(sorted);
  const int H = 3;
  std::int32_t MB = 0;
  for (int r = 0; r < num_req; ++r) MB = std::max(MB, meta.num_blocks(r));
  MB += 2;  // wider than needed
  const std::size_t rows = std::size_t(meta.num_tokens) * H;
  std::vector<float> scores(rows * MB);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), kNegInf,
                            std::numeric_limits<float>::infinity(), 0.0f, -0.0f, 1.0f, -1.0f};
  if (pattern == ScorePattern::adversarial) {
    for (std::size_t i = 0; i < scores.size(); ++i) {
      const std::uint64_t kind = rng() % 10;
      if (kind < 3) scores[i] = specials[rng() % 7];
      else if (kind < 6) scores[i] = float(int(rng() % 5));                     // heavy ties
      else scores[i] = std::normal_distribution<float>(0.0f, 10.0f)(rng);
    }
  } else {
    std::normal_distribution<float> noise(0.0f, 1.0f);
    for (std::size_t row = 0; row < rows; ++row) {
      // Every seventh row -inf but for its runs.
      for (std::int32_t b = 0; b < MB; ++b) scores[row * MB + b] = row % 7 == 3 ? kNegInf : noise(rng);
      for (int run = 0; run < 6; ++run) {
        const std::int32_t length = 1 + std::int32_t(rng() % 8);
        const std::int32_t first = std::int32_t(rng() % std::uint64_t(MB));
        const float high = float(10 + int(rng() % 3));
        for (std::int32_t b = first; b < std::min(MB, first + length); ++b) scores[row * MB + b] = high;
      }
    }
  }
  msa::test::DeviceStep step(meta);
  DeviceBuffer<float> dev_scores(scores);
  for (auto v : {std::array<int, 3>{16, 0, 1}, std::array<int, 3>{64, 1, 2}, std::array<int, 3>{1, 0, 1},
                 std::array<int, 3>{7, 3, 0}}) {
    SCOPED_TRACE(msa::detail::concat("topk=", v[0], " init=", v[1], " local=", v[2], ", ", MB, " blocks per row"));
    DeviceBuffer<std::int32_t> out(rows * v[0]);
    out.fill_bytes(0x7F);
    msa::IndexerArgs args;
    args.num_kv_heads = H;
    args.init_blocks = v[1];
    args.local_blocks = v[2];
    args.out = msa::TopkView::token_major(out.data(), H, v[0]);
    msa::cuda::select_topk(step.view, dev_scores.data(), MB, args, nullptr);
    const auto got = out.download();
    std::vector<std::int32_t> want(v[0]);
    std::int64_t bad = 0;
    for (std::size_t row = 0; row < rows; ++row) {
      const std::int32_t t = std::int32_t(row / H);
      const std::int32_t p = meta.token_position[t];
      msa::cpu::select_row(scores.data() + row * MB, p < 0 ? -1 : p / kBlockSize, v[0], v[1], v[2], want.data());
      if (!std::equal(want.begin(), want.end(), got.begin() + row * v[0]) && bad++ == 0) {
        ADD_FAILURE() << "row " << row << " (t=" << t << ", last block " << p / kBlockSize
                      << ") first differing column: "
                      << std::mismatch(want.begin(), want.end(), got.begin() + row * v[0]).first - want.begin();
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(CudaIndexer, SelectTopkAdversarialScores) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(44);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  const int num_req = msa::test::size_for(24, 6);
  std::vector<int> seq_lens;
  for (int r = 0; r < num_req; ++r) seq_lens.push_back(1 + int(rng() % (r % 3 == 0 ? 200000 : 9000)));
  check_select_on_adversarial_scores(seq_lens, rng);
}

// A step's rows select with a block per row while they are few for the GPU
// (select.cu: up to 6 rows per SM, rows of 256 blocks or more), with a warp
// per row beyond: steps of about 24 rows and of 5, 10, 20 and 30 rows per SM,
// rows of up to 40K tokens, through both the lower-bound filter and the radix
// select (topk 64, heavy ties), on adversarial scores and on runs of winners.
TEST(CudaIndexer, SelectTopkBlockAndWarpRows) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(46);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (int per_sm : {0, 5, 10, 20, 30}) {
    // 3 heads, every fifth request 3 tokens: 4.2 rows per request on average.
    const int rows = per_sm == 0 ? 24 : per_sm * sms;
    const int num_req = std::max(2, rows * 5 / 21);
    SCOPED_TRACE(msa::detail::concat(num_req, " requests"));
    std::vector<int> seq_lens{40000};
    for (int r = 1; r < num_req; ++r) seq_lens.push_back(1 + int(rng() % 40000));
    check_select_on_adversarial_scores(seq_lens, rng);
    check_select_on_adversarial_scores(seq_lens, rng, ScorePattern::runs);
  }
}

// Long rows: the selection stages a row's keys in shared memory up to about
// 10K blocks per row (fewer rows per CTA as rows grow) and reads the scores in
// place beyond; both sides of that limit.
TEST(CudaIndexer, SelectTopkLongRows) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(45);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  // 1M-token rows (8,193 blocks: staged, one row per CTA) with shorter ones.
  check_select_on_adversarial_scores({1 << 20, 3000, 1 << 20, 700000, 1, 1 << 20}, rng);
  // 1.5M tokens (12,289 blocks): past the stage.
  check_select_on_adversarial_scores({1536 * 1024, 50000, 1536 * 1024 - 5}, rng);
}

// Long rows of a step too many to select a block each (select.cu: the
// persistent warps, a stage of block_limit scores a warp, fewer warps per CTA
// as rows grow): 56,000-block rows (7.2M tokens: one warp per CTA, staged)
// and 57,000-block rows (past the stage: the scores read where they are).
TEST(CudaIndexer, SelectTopkLongRowsOnWarps) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode()) GTEST_SKIP() << "about 200 MB of scores a step";
  const std::uint64_t seed = msa::test::seed_for(47);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  // 3 heads, every fifth request 3 tokens: 4.2 rows per request, past 6 rows per SM.
  const int num_req = (sms * 6 + 32) * 5 / 21;
  for (int blocks : {56000, 57000}) {
    SCOPED_TRACE(msa::detail::concat(blocks, " blocks"));
    std::vector<int> seq_lens{blocks * kBlockSize};
    for (int r = 1; r < num_req; ++r) seq_lens.push_back(1 + int(rng() % (std::uint64_t(blocks) * kBlockSize)));
    check_select_on_adversarial_scores(seq_lens, rng);
  }
}

TEST(CudaIndexer, BadBlockTableEntryIsRecorded) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(55);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  // nvfp4 twice: widened in the score kernel, and widened ahead (a chunk long
  // enough, a workspace with room).
  for (int kind = 0; kind < 4; ++kind) {
    const DType keys = kind == 0 ? DType::bf16 : kind == 1 ? DType::fp8_e4m3 : DType::nvfp4;
    Shape sh;
    sh.query_lens = {1, kind == 3 ? 1100 : 40};
    sh.seq_lens = {700, kind == 3 ? 1200 : 900};
    sh.heads = 2;
    sh.keys = keys;
    sh.iq = keys == DType::fp8_e4m3 ? keys : DType::bf16;
    sh.widen_room = kind == 3;
    sh.seed = s++;
    SCOPED_TRACE(sh.name());
    Problem pb = make_problem(sh);
    const std::int32_t bad_page = std::int32_t(pb.num_pages + 1000);
    pb.table[1 * pb.table_stride + 3] = bad_page;  // request 1 (a prefill), block 3
    DeviceProblem dev(pb);
    msa::test::CheckBuffer check;
    dev.run(pb, check.get());
    msa::test::device_sync();
    EXPECT_EQ(check.message(), msa::detail::concat("index block_table[r=1, b=3] = ", bad_page,
                                                   " but the index cache has ", pb.num_pages, " pages"));
    // The rows of request 1 still get a valid selection (block 3 scored NaN).
    const auto topk = dev.topk_token_major(pb);
    for (std::int32_t t = pb.meta.query_start[1]; t < pb.meta.num_tokens; ++t) {
      const std::int32_t* row = topk.data() + std::int64_t(t) * sh.heads * sh.topk;
      for (int k = 0; k < sh.topk; ++k) ASSERT_TRUE(row[k] >= -1 && row[k] <= last_block(pb, t)) << t;
    }
  }
}

// index() allocates nothing and never synchronizes: it can be captured in a
// CUDA graph, and a replay writes the same top-k as a direct call.
TEST(CudaIndexer, CapturedInCudaGraph) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(66);
  MSA_TRACE_SEED(seed);
  Shape sh;
  sh.decode_threshold = 2;
  sh.query_lens = {2, 2, 2, 50};
  sh.seq_lens = {900, 2, 3000, 1500};
  sh.heads = 4;
  sh.seed = seed;
  const Problem pb = make_problem(sh);
  DeviceProblem dev(pb);
  dev.run(pb);
  msa::test::device_sync();
  const std::vector<std::int32_t> direct = dev.topk.download();

  dev.topk.fill_bytes(0x7F);
  msa::test::CheckBuffer check;
  cudaStream_t stream;
  MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  msa::cuda::reset_check(check.get(), stream);
  dev.run(pb, check.get(), stream);
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(dev.topk.download() == direct);
  EXPECT_EQ(check.message(), "");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

// Appends a line to $OUT/gpu_timing.txt (the device script's output folder) and stdout.
void report_timing(const std::string& line) {
  std::printf("[ timing ] %s\n", line.c_str());
  if (const char* out = std::getenv("OUT")) {
    if (FILE* f = std::fopen((std::string(out) + "/gpu_timing.txt").c_str(), "a")) {
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
  }
}

double time_index(const Problem& pb, DeviceProblem& dev, int reps) {
  dev.run(pb);
  msa::test::device_sync();
  cudaEvent_t a, b;
  MSA_CUDA_CHECK(cudaEventCreate(&a));
  MSA_CUDA_CHECK(cudaEventCreate(&b));
  MSA_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) dev.run(pb);
  MSA_CUDA_CHECK(cudaEventRecord(b));
  MSA_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  MSA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return ms / reps;
}

// Large shapes, GPU only: times index() and reports throughput, then checks the
// timed calls' scores and selection against the CPU engine.
TEST(CudaIndexer, TimingLargeShapes) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode()) GTEST_SKIP() << "timing is skipped under the sanitizer";
  {
    Shape sh;  // one 16K-token chunk after 16K cached tokens, 4 index heads
    sh.query_lens = {16384};
    sh.seq_lens = {32768};
    sh.decode_threshold = 0;
    sh.heads = 4;
    sh.shared_pool = 256;
    const Problem pb = make_problem(sh);
    DeviceProblem dev(pb);
    const double ms = time_index(pb, dev, 5);
    expect_matches_cpu(sh, pb, dev, false);
    double macs = 0;
    for (std::int32_t t = 0; t < pb.meta.num_tokens; ++t)
      macs += double(pb.meta.token_position[t] + 1) * kHeadDim * sh.heads;
    report_timing(msa::detail::concat("index prefill 16384 tokens (ctx 16384 -> 32768), H=4, bf16: ",
                                      ms, " ms, ", 2 * macs / ms * 1e-9, " TFLOP/s (causal dots)"));
  }
  for (int dql : {1, 2}) {
    Shape sh;  // 128 decodes of 128K context, 4 index heads
    sh.decode_threshold = dql;
    sh.query_lens.assign(128, dql);
    sh.seq_lens.assign(128, 131072);
    sh.heads = 4;
    sh.shared_pool = 4096;
    const Problem pb = make_problem(sh);
    DeviceProblem dev(pb);
    const double ms = time_index(pb, dev, 5);
    expect_matches_cpu(sh, pb, dev, false);
    const double bytes = 128.0 * 131072 * kHeadDim * 2;
    report_timing(msa::detail::concat("index decode 128 x 128K ctx, query_len ", dql, ", H=4, bf16: ", ms,
                                      " ms, ", bytes / ms * 1e-6, " GB/s of index keys"));
  }
}

// Large shapes on the lower-precision caches, GPU only: fp8 keys with fp8
// queries (prefill and decode), nvfp4 keys (decode), the shapes of
// TimingLargeShapes, each timed and then checked against the CPU engine.
TEST(CudaIndexer, TimingLowPrecisionShapes) {
  MSA_SKIP_WITHOUT_GPU();
  if (msa::test::sanitizer_mode()) GTEST_SKIP() << "timing is skipped under the sanitizer";
  for (DType keys : {DType::fp8_e4m3, DType::nvfp4}) {
    const DType iq = keys == DType::fp8_e4m3 ? DType::fp8_e4m3 : DType::bf16;
    const std::string what = msa::detail::concat("keys ", msa::dtype_name(keys), ", iq ", msa::dtype_name(iq));
    if (keys == DType::fp8_e4m3) {
      Shape sh;
      sh.query_lens = {16384};
      sh.seq_lens = {32768};
      sh.decode_threshold = 0;
      sh.heads = 4;
      sh.keys = keys;
      sh.iq = iq;
      sh.shared_pool = 256;
      const Problem pb = make_problem(sh);
      DeviceProblem dev(pb);
      const double ms = time_index(pb, dev, 5);
      expect_matches_cpu(sh, pb, dev, false);
      double macs = 0;
      for (std::int32_t t = 0; t < pb.meta.num_tokens; ++t)
        macs += double(pb.meta.token_position[t] + 1) * kHeadDim * sh.heads;
      report_timing(msa::detail::concat("index prefill 16384 tokens (ctx 16384 -> 32768), H=4, ", what, ": ", ms,
                                        " ms, ", 2 * macs / ms * 1e-9, " TFLOP/s (causal dots)"));
    }
    // (query_len, heads, pool pages): the pool of the one-row case exceeds L2,
    // so that its page loads land out of order, as in serving.
    for (const auto& [dql, heads, pool] : {std::tuple{1, 4, 4096}, std::tuple{2, 4, 4096}, std::tuple{1, 1, 8192}}) {
      Shape sh;
      sh.decode_threshold = dql;
      sh.query_lens.assign(128, dql);
      sh.seq_lens.assign(128, 131072);
      sh.heads = heads;
      sh.keys = keys;
      sh.iq = iq;
      sh.shared_pool = pool;
      const Problem pb = make_problem(sh);
      DeviceProblem dev(pb);
      const double ms = time_index(pb, dev, 5);
      expect_matches_cpu(sh, pb, dev, false);
      const double bytes = 128.0 * 1024 * double(msa::index_page_bytes(keys));  // 1024 blocks a request
      report_timing(msa::detail::concat("index decode 128 x 128K ctx, query_len ", dql, ", H=", heads, ", ", what,
                                        ": ", ms, " ms, ", bytes / ms * 1e-6, " GB/s of index keys"));
    }
  }
}

}  // namespace
