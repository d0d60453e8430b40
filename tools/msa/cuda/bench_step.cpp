#include "bench_step.hpp"

#include <algorithm>

#include "fill.hpp"
#include "msa/error.hpp"
#include "timer.hpp"

namespace msa::tool {

void make_step(const BenchCase& c, Step& st) {
  st.meta = build_metadata(bench_batch_spec(c));
  st.query_start = to_device(st.meta.query_start);
  st.seq_lens = to_device(st.meta.seq_lens);
  st.token_request = to_device(st.meta.token_request);
  st.view = st.meta.view();
  st.view.query_start = st.query_start.as<std::int32_t>();
  st.view.seq_lens = st.seq_lens.as<std::int32_t>();
  st.view.token_request = st.token_request.as<std::int32_t>();
}

Traffic mean_traffic(const std::vector<Traffic>& copies) {
  Traffic t;
  for (const Traffic& c : copies) t = t + c;
  const auto n = std::int64_t(std::max<std::size_t>(copies.size(), 1));
  t.flops /= double(n);
  t.fp8_flops /= double(n);
  t.bytes /= double(n);
  t.keys /= n;
  t.blocks /= n;
  return t;
}

TimedRun time_graphs(const std::function<void(int)>& direct, int copies, const BenchSettings& s,
                     cuda::Stream stream) {
  TimedRun run;
  direct(0);
  sync_stream(stream);
  std::vector<GraphExec> graphs;
  try {
    for (int i = 0; i < copies; ++i) graphs.emplace_back([&, i] { direct(i); }, stream);
  } catch (const Error& e) {
    run.graph = false;
    run.note = std::string("timed without a CUDA graph: ") + e.what();
    graphs.clear();
  }
  auto launch = [&](int i) {
    if (run.graph) graphs[std::size_t(i % copies)].launch(stream);
    else direct(i % copies);
  };
  const TimeStats pilot = summarize_ms(time_replays(launch, copies, 3, stream));
  int n = s.iters;
  if (pilot.median_us > 0.0) n = std::min(n, std::max(10, int(s.budget_ms * 1e3 / pilot.median_us)));
  run.time = summarize_ms(time_replays(launch, s.warmup, std::max(n, 1), stream));
  return run;
}

ScaleMode kv_scale_mode(DType kv_dtype, const BenchSettings& s) {
  if (!is_fp8(kv_dtype)) return ScaleMode::none;
  return s.token_scales ? ScaleMode::per_token_head : ScaleMode::per_tensor;
}

KvPool make_kv_pool(DType dtype, ScaleMode mode, std::int64_t pages, int num_kv_heads, std::uint64_t seed,
                    cuda::Stream stream) {
  KvPool p;
  const int H = num_kv_heads;
  // Per-token scales live in their own arrays, not in the pages.
  p.block_bytes = kv_block_bytes(dtype, is_fp8(dtype) ? ScaleMode::per_tensor : mode);
  p.page_bytes = p.block_bytes * H;
  p.data = DeviceBuffer(std::size_t(pages * p.page_bytes));
  if (dtype == DType::nvfp4) {
    fill_nvfp4(p.data.get(), pages * p.page_bytes, p.page_bytes, H, seed, stream);
    p.cache = make_nvfp4_cache_view(p.data.get(), pages, H, 1.0f / 64, 1.0f / 64);
  } else {
    const auto eb = std::int64_t(dtype_bytes(dtype));
    fill_random(p.data.get(), pages * p.page_bytes / eb, dtype, is_fp8(dtype) ? 16.0f : 1.0f, seed, stream);
    p.cache = make_cache_view(dtype, p.data.get(), pages, H, Layout::hnd);
    if (is_fp8(dtype)) p.cache.k_scale = p.cache.v_scale = 1.0f / 16;
  }
  if (mode == ScaleMode::per_token_head) {
    // Every scale 0x3C3C3C3C (about 0.0115): one byte fill per array.
    const auto bytes = std::size_t(pages * kBlockSize * H) * sizeof(float);
    p.k_scales = DeviceBuffer(bytes);
    p.v_scales = DeviceBuffer(bytes);
    p.k_scales.fill_bytes(0x3C);
    p.v_scales.fill_bytes(0x3C);
    p.cache.scale_mode = mode;
    p.cache.k_scales = p.k_scales.as<float>();
    p.cache.v_scales = p.v_scales.as<float>();
  }
  return p;
}

AttendPlan make_attend_plan(const BenchCase& c, const BenchSettings& s, const BatchMetadata& m, ScaleMode mode,
                            cuda::Stream stream) {
  // The problem: the arguments' plain fields (make_attend_args's, the cache's dtype and scales).
  KVCacheView cache;
  cache.dtype = c.dtype;
  cache.num_kv_heads = c.num_kv_heads;
  cache.scale_mode = mode;
  const AttentionArgs problem = make_attend_args(c, nullptr, nullptr, nullptr, cache, nullptr, m.num_requests, 0);
  AttendPlan p;
  const std::size_t bytes = cuda::attention_workspace_bytes(m, problem, s.tuning);
  p.workspace = DeviceBuffer(bytes);
  p.plan = cuda::plan_attention(m, problem, {p.workspace.get(), bytes}, stream, s.tuning);
  return p;
}

AttentionArgs make_attend_args(const BenchCase& c, const void* q, void* out, std::int32_t* topk,
                               const KVCacheView& cache, const std::int32_t* table, std::int32_t num_requests,
                               std::int32_t max_blocks) {
  AttentionArgs a;
  a.q = q;
  a.q_dtype = DType::bf16;
  a.out = out;
  a.out_dtype = DType::bf16;
  a.lse = nullptr;
  a.num_q_heads = c.num_q_heads;
  a.topk = TopkView::token_major(topk, c.num_kv_heads, c.topk);
  a.cache = cache;
  a.block_table = BlockTable{table, num_requests, max_blocks, max_blocks};
  return a;
}

}  // namespace msa::tool
