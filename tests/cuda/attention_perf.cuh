// Throughput measurement of the GPU attention tests: a synthetic bf16 step built
// on the device, timed with CUDA events, its output then checked on sampled
// rows against the float64 oracle. Prints numbers for the log.
#pragma once

#include "attention_test_support.hpp"

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

// The float64 oracle on up to 8 tokens spread over the step: the K / V of the
// blocks each selected (copied back from the HND bf16 cache at `cache`), dense
// masked attention over the keys j <= p, against the step's `out` and `lse`.
// Each token's output row (all query heads) within the contract's bounds.
//   ids: [num_tokens, kv_heads, topk], table: [num_requests, max_blocks]
void expect_sampled_rows_match(const BatchMetadata& meta, const std::vector<std::int32_t>& table,
                               std::int32_t max_blocks, const std::vector<std::int32_t>& ids, const std::uint16_t* cache,
                               const std::uint16_t* q, const std::uint16_t* out, const float* lse, int q_heads,
                               int kv_heads, int topk, float softmax_scale) {
  const int G = q_heads / kv_heads;
  const std::int64_t head_elements = 128 * 256;  // one head of an HND page: [128 tokens][K | V]
  const std::int64_t page_elements = head_elements * kv_heads;
  for (int i = 0; i < 8 && i < meta.num_tokens; ++i) {
    const std::int32_t t = std::int32_t(std::int64_t(meta.num_tokens - 1) * i / 7);
    const std::int32_t r = meta.token_request[t], p = meta.token_position[t];
    const std::int64_t row = std::int64_t(q_heads) * 128;  // one token's output
    std::vector<std::uint16_t> q16(row), out16(row);
    std::vector<float> lse32(q_heads);
    MSA_CUDA_CHECK(cudaMemcpy(q16.data(), q + t * row, row * 2, cudaMemcpyDeviceToHost));
    MSA_CUDA_CHECK(cudaMemcpy(out16.data(), out + t * row, row * 2, cudaMemcpyDeviceToHost));
    MSA_CUDA_CHECK(cudaMemcpy(lse32.data(), lse + std::int64_t(t) * q_heads, q_heads * 4, cudaMemcpyDeviceToHost));
    std::vector<double> want(row), want_lse(q_heads), got(row), got_lse(lse32.begin(), lse32.end());
    for (std::int64_t j = 0; j < row; ++j) got[j] = msa::num::bf16_to_float(out16[j]);
    for (int h = 0; h < kv_heads; ++h) {
      std::vector<std::int32_t> blocks;
      for (int k = 0; k < topk; ++k) {
        const std::int32_t id = ids[(std::size_t(t) * kv_heads + h) * topk + k];
        if (id >= 0 && id <= p / 128) blocks.push_back(id);
      }
      std::vector<double> kd, vd;
      std::vector<std::uint16_t> page(head_elements);
      for (const std::int32_t b : blocks) {
        const std::int64_t phys = table[std::size_t(r) * max_blocks + b];
        MSA_CUDA_CHECK(cudaMemcpy(page.data(), cache + phys * page_elements + h * head_elements, head_elements * 2,
                                  cudaMemcpyDeviceToHost));
        for (std::int32_t j = 0; j < 128 && b * 128 + j <= p; ++j) {
          for (int d = 0; d < 128; ++d) {
            kd.push_back(msa::num::bf16_to_float(page[j * 256 + d]));
            vd.push_back(msa::num::bf16_to_float(page[j * 256 + 128 + d]));
          }
        }
      }
      const std::int64_t nk = std::int64_t(kd.size() / 128);
      std::vector<double> qd(std::size_t(G) * 128);
      for (std::int64_t j = 0; j < G * 128; ++j) qd[j] = msa::num::bf16_to_float(q16[h * G * 128 + j]);
      const std::vector<std::uint8_t> mask(std::size_t(G * nk), 1);
      msa::ref::masked_attention(qd.data(), kd.data(), vd.data(), mask.data(), G, nk, softmax_scale,
                                 want.data() + h * G * 128, want_lse.data() + h * G);
    }
    const msa::ref::Comparison o = msa::ref::compare_rows(got, want, row, "perf out");
    const msa::ref::Comparison l = msa::ref::compare_lse(got_lse, want_lse, "perf lse");
    EXPECT_TRUE(o.rel_ok(kOutTol)) << "token " << t << ": " << o.describe();
    EXPECT_TRUE(l.abs_ok(kLseTol)) << "token " << t << ": " << l.describe();
  }
}

struct PerfResult {
  double us = 0.0;       // per attend call
  double kv_bytes = 0.0; // K/V bytes of the selected blocks
  double flops = 0.0;    // 4 * 128 * visible keys per query head
};

// A synthetic step on a bf16 HND cache filled on the device: `seq_lens` per
// request, `query_lens` new tokens each, random valid top-k (clustered: as
// clustered_topk, neighbouring tokens sharing most blocks); the heuristic's
// plan or forced split factors, under `tuning`.
PerfResult time_attend(const std::vector<std::int32_t>& query_lens, const std::vector<std::int32_t>& seq_lens,
                       int q_heads, int kv_heads, int topk, int decode_threshold, bool clustered = false,
                       std::optional<msa::cuda::attention::Splits> forced = std::nullopt,
                       const msa::cuda::AttentionTuning& tuning = {}) {
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
  const auto ids = clustered ? clustered_topk(meta, kv_heads, topk, 9, false)
                             : random_topk(meta, kv_heads, topk, 9, false);

  // Several "layers" (caches) used in turn, so that the K/V read by one call
  // is not still in L2 from the previous one (as in a real model).
  const msa::KVCacheView host_view = msa::make_cache_view(DType::bf16, nullptr, pages, kv_heads, Layout::hnd);
  const std::int64_t extent = msa::cache_extent(host_view);
  const double touched = double(std::min<std::int64_t>(pages, std::int64_t(meta.num_tokens) * topk)) *
                         kv_heads * 65536.0;
  const int layers = int(std::clamp(std::ceil(256e6 / touched), 1.0, 20.0));
  DeviceBuffer<std::uint16_t> cache(std::size_t(extent) * layers);
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
  Planned p = make_plan(meta, a, tuning, forced);

  auto layer = [&](int i) {
    AttentionArgs l = a;
    l.cache = msa::make_cache_view(DType::bf16, cache.data() + std::size_t(extent) * (i % layers), pages,
                                   kv_heads, Layout::hnd);
    return l;
  };

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
  // Plain launches on a stream (includes the host cost of each call), then
  // the same calls captured in one CUDA graph (how a decode step runs).
  cudaStream_t stream;
  MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  MSA_CUDA_CHECK(cudaEventCreate(&start));
  MSA_CUDA_CHECK(cudaEventCreate(&stop));
  const int iters = 20;
  auto timed = [&](auto&& body) {
    body();  // warm-up
    MSA_CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    MSA_CUDA_CHECK(cudaEventRecord(stop, stream));
    MSA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    MSA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return 1000.0 * ms / iters;
  };
  MSA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  const double stream_us = timed([&] {
    for (int i = 0; i < iters; ++i) msa::cuda::attend(p.plan, step.view, layer(i), stream);
  });
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < iters; ++i) msa::cuda::attend(p.plan, step.view, layer(i), stream);
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  res.us = timed([&] { MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  // The timed calls computed something: the last one's rows against the oracle.
  expect_sampled_rows_match(meta, table, max_blocks, ids, cache.data() + std::size_t(extent) * ((iters - 1) % layers),
                            q.data(), out.data(), lse.data(), q_heads, kv_heads, topk, a.softmax_scale);
  const msa::cuda::AttentionSchedule& sched = p.plan.schedule;
  const bool tiles = sched.tiles > 0;
  std::printf("[attention-perf] tokens %d (decode %d) heads %d/%d topk %d splits %d/%d%s%s %s layers %d: graph "
              "%.1f us (stream %.1f us), %.0f GB/s of K/V, %.1f TFLOP/s\n",
              meta.num_tokens, meta.num_decode_tokens, q_heads, kv_heads, topk, sched.decode_splits,
              sched.prefill_splits, forced ? " (forced)" : "", tiles ? " tiles" : "",
              clustered ? "clustered" : "random",
              layers, res.us,
              stream_us, res.kv_bytes / res.us * 1e-3, res.flops / res.us * 1e-6);
  MSA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MSA_CUDA_CHECK(cudaGraphDestroy(graph));
  MSA_CUDA_CHECK(cudaEventDestroy(start));
  MSA_CUDA_CHECK(cudaEventDestroy(stop));
  MSA_CUDA_CHECK(cudaStreamDestroy(stream));
  return res;
}

}  // namespace
