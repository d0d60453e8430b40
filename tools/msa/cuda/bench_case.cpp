// One case of `msa bench`.
//
// Inputs: `batch` requests, each with `context` cached tokens and query_len
// new ones (seq_len = context + query_len; all prefill requests, or all
// decodes / verifies: bench_batch_spec). The case's top-k lists are synthetic
// (bench_topk.hpp). Rotation beyond L2: the case gets `copies` independent
// input sets (own top-k lists, own block tables, own physical pages in one
// pool filled on the device), enough that together they span at least 4x the
// L2; replay i runs copy i % copies, so consecutive replays touch different
// memory. Queries, outputs and the workspaces are shared (they are small next
// to the caches, or written).
#include "bench_case.hpp"

#include <algorithm>
#include <functional>
#include <vector>

#include "device_memory.hpp"
#include "fill.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/error.hpp"
#include "read_floor.hpp"
#include "rng.hpp"
#include "timer.hpp"

namespace msa::tool {

namespace {

// The step's metadata on the host and its device copy.
struct Step {
  BatchMetadata meta;
  DeviceBuffer query_start, seq_lens, token_request;
  StepView view;
};

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

// One rotated input set.
struct InputCopy {
  std::vector<std::int32_t> topk;  // [num_tokens, H, topk] (attend only)
  PageMap map;
  std::int64_t first_page = 0;
  Traffic traffic;
  DeviceBuffer d_topk, d_table;
};

Traffic mean_traffic(const std::vector<InputCopy>& copies) {
  Traffic t;
  for (const InputCopy& c : copies) {
    t.flops += c.traffic.flops;
    t.bytes += c.traffic.bytes;
    t.keys += c.traffic.keys;
    t.blocks += c.traffic.blocks;
  }
  const auto n = std::int64_t(copies.size());
  t.flops /= double(n);
  t.bytes /= double(n);
  t.keys /= n;
  t.blocks /= n;
  return t;
}

// Eager run, then graphs (or direct calls if capture fails), then the timing.
void time_case(const std::function<void(int)>& direct, int copies, const BenchSettings& s, cuda::Stream stream,
               BenchResult& res) {
  direct(0);  // loads the kernels, catches argument errors
  sync_stream(stream);
  std::vector<GraphExec> graphs;
  res.graph = true;
  try {
    for (int i = 0; i < copies; ++i) graphs.emplace_back([&, i] { direct(i); }, stream);
  } catch (const Error& e) {
    res.graph = false;
    res.note = std::string("timed without a CUDA graph: ") + e.what();
    graphs.clear();
  }
  auto launch = [&](int i) {
    if (res.graph) graphs[std::size_t(i % copies)].launch(stream);
    else direct(i % copies);
  };
  const TimeStats pilot = summarize_ms(time_replays(launch, copies, 3, stream));
  int n = s.iters;
  if (pilot.median_us > 0.0) n = std::min(n, std::max(10, int(s.budget_ms * 1e3 / pilot.median_us)));
  res.time = summarize_ms(time_replays(launch, s.warmup, std::max(n, 1), stream));
}

// The read floor of an attend case: every copy's distinct (request, KV head,
// block) units, the K and V of one head's block (`unit` bytes, contiguous in
// the bench's compact hnd and nvfp4 pages of `page_bytes`), gathered from the
// same pages; timed like the case.
void time_read_floor(const BenchCase& c, const BatchMetadata& m, const std::vector<InputCopy>& copies,
                     const DeviceBuffer& pool, std::int64_t unit, std::int64_t page_bytes, const BenchSettings& s,
                     cuda::Stream stream, BenchResult& res) {
  std::vector<DeviceBuffer> offsets;
  std::vector<std::int32_t> counts;
  for (const InputCopy& cp : copies) {
    std::vector<std::int64_t> off;
    for_each_read_block(m.query_start, m.seq_lens, cp.topk, c.num_kv_heads, c.topk, [&](std::int32_t r, int h, std::int32_t b) {
      const std::int32_t page = cp.map.table[std::size_t(r) * std::size_t(cp.map.max_blocks) + std::size_t(b)];
      off.push_back(std::int64_t(page) * page_bytes + h * unit);
    });
    counts.push_back(std::int32_t(off.size()));
    offsets.push_back(to_device(off));
  }
  BenchResult floor;
  time_case([&](int i) { gather_blocks(pool.get(), offsets[std::size_t(i)].as<std::int64_t>(), counts[std::size_t(i)], std::int32_t(unit), stream); },
            int(copies.size()), s, stream, floor);
  res.read_floor = floor.time;
}

void bench_attend(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res) {
  Step st;
  make_step(c, st);
  const BatchMetadata& m = st.meta;
  const int H = c.num_kv_heads, QH = c.num_q_heads, K = c.topk;
  const ScaleMode mode = !is_fp8(c.dtype)  ? ScaleMode::none
                         : s.token_scales ? ScaleMode::per_token_head
                                          : ScaleMode::per_tensor;
  // The pool holds the K / V data; per-token scales live in their own arrays
  // (their bytes count in the traffic, not in the read floor).
  const std::int64_t data_block_bytes = kv_block_bytes(c.dtype, is_fp8(c.dtype) ? ScaleMode::per_tensor : mode);
  const std::int64_t page_bytes = data_block_bytes * H;

  std::vector<InputCopy> copies;
  auto add_copy = [&](int i) {
    InputCopy cp;
    cp.first_page = copies.empty() ? 0 : copies.back().first_page + copies.back().map.pages;
    cp.topk = make_bench_topk(m.query_start, m.seq_lens, H, K, c.prefill, s.pattern, mix64(s.seed * 977 + std::uint64_t(i)));
    cp.map = map_pages(m.query_start, m.seq_lens, cp.topk, H, K, false, cp.first_page);
    cp.traffic = attend_traffic(m.query_start, m.seq_lens, cp.topk, H, QH / H, K, kv_block_bytes(c.dtype, mode));
    copies.push_back(std::move(cp));
  };
  add_copy(0);
  res.copies = rotation_copies(copies[0].traffic.bytes, double(copies[0].map.pages * page_bytes), s.l2_bytes,
                               s.memory_budget);
  for (int i = 1; i < res.copies; ++i) add_copy(i);
  const std::int64_t pages = copies.back().first_page + copies.back().map.pages;

  DeviceBuffer pool(std::size_t(pages * page_bytes));
  KVCacheView cache;
  if (c.dtype == DType::nvfp4) {
    fill_nvfp4(pool.get(), pages * page_bytes, page_bytes, H, s.seed, stream);
    cache = make_nvfp4_cache_view(pool.get(), pages, H, 1.0f / 64, 1.0f / 64);
  } else {
    const auto eb = std::int64_t(dtype_bytes(c.dtype));
    fill_random(pool.get(), pages * page_bytes / eb, c.dtype, is_fp8(c.dtype) ? 16.0f : 1.0f, s.seed, stream);
    cache = make_cache_view(c.dtype, pool.get(), pages, H, Layout::hnd);
    if (is_fp8(c.dtype)) cache.k_scale = cache.v_scale = 1.0f / 16;
  }
  DeviceBuffer k_scales, v_scales;
  if (mode == ScaleMode::per_token_head) {
    // Every scale 0x3C3C3C3C (about 0.0115): one byte fill per array.
    const auto bytes = std::size_t(pages * kBlockSize * H) * sizeof(float);
    k_scales = DeviceBuffer(bytes);
    v_scales = DeviceBuffer(bytes);
    k_scales.fill_bytes(0x3C);
    v_scales.fill_bytes(0x3C);
    cache.scale_mode = mode;
    cache.k_scales = static_cast<float*>(k_scales.get());
    cache.v_scales = static_cast<float*>(v_scales.get());
  }
  for (InputCopy& cp : copies) {
    cp.d_topk = to_device(cp.topk);
    cp.d_table = to_device(cp.map.table);
  }
  const std::int64_t T = m.num_tokens;
  DeviceBuffer q(std::size_t(T * QH * kHeadDim * 2)), out(std::size_t(T * QH * kHeadDim * 2));
  fill_random(q.get(), T * QH * kHeadDim, DType::bf16, 1.0f, s.seed + 1, stream);

  // The problem the plan is for: the arguments of every copy but their top-k and table.
  AttentionArgs problem;
  problem.q = q.get();
  problem.q_dtype = DType::bf16;
  problem.out = out.get();
  problem.out_dtype = DType::bf16;
  problem.lse = nullptr;
  problem.num_q_heads = QH;
  problem.topk = TopkView::token_major(nullptr, H, K);
  problem.cache = cache;
  const std::size_t ws_bytes = cuda::attention_workspace_bytes(m, problem, s.tuning);
  DeviceBuffer ws(ws_bytes);
  const cuda::AttentionPlan plan = cuda::plan_attention(m, problem, {ws.get(), ws_bytes}, stream, s.tuning);
  std::vector<AttentionArgs> args(copies.size(), problem);
  for (std::size_t i = 0; i < copies.size(); ++i) {
    AttentionArgs& a = args[i];
    a.topk = TopkView::token_major(copies[i].d_topk.as<std::int32_t>(), H, K);
    a.block_table = BlockTable{copies[i].d_table.as<std::int32_t>(), m.num_requests, copies[i].map.max_blocks,
                               copies[i].map.max_blocks};
  }
  res.traffic = mean_traffic(copies);
  res.device_bytes = double(pool.bytes() + k_scales.bytes() + v_scales.bytes() + q.bytes() + out.bytes() + ws.bytes());
  for (const InputCopy& cp : copies) res.device_bytes += double(cp.d_topk.bytes() + cp.d_table.bytes());
  time_case([&](int i) { cuda::attend(plan, st.view, args[std::size_t(i)], stream); }, res.copies, s, stream, res);
  if (!c.prefill) time_read_floor(c, m, copies, pool, data_block_bytes, page_bytes, s, stream, res);
}

void bench_index(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res) {
  Step st;
  make_step(c, st);
  const BatchMetadata& m = st.meta;
  const int H = c.num_kv_heads, K = c.topk;
  const auto eb = std::int64_t(dtype_bytes(c.dtype));
  const std::int64_t page_bytes = std::int64_t(kBlockSize) * kHeadDim * eb;

  std::vector<InputCopy> copies;
  auto add_copy = [&] {
    InputCopy cp;
    cp.first_page = copies.empty() ? 0 : copies.back().first_page + copies.back().map.pages;
    cp.map = map_pages(m.query_start, m.seq_lens, {}, H, K, true, cp.first_page);
    cp.traffic = index_traffic(m.query_start, m.seq_lens, H, c.dtype);
    copies.push_back(std::move(cp));
  };
  add_copy();
  res.copies = rotation_copies(copies[0].traffic.bytes, double(copies[0].map.pages * page_bytes), s.l2_bytes,
                               s.memory_budget);
  for (int i = 1; i < res.copies; ++i) add_copy();
  const std::int64_t pages = copies.back().first_page + copies.back().map.pages;

  DeviceBuffer pool(std::size_t(pages * page_bytes));
  fill_random(pool.get(), pages * page_bytes / eb, c.dtype, 1.0f, s.seed, stream);
  IndexCacheView cache;
  cache.dtype = c.dtype;
  cache.base = pool.get();
  cache.num_pages = pages;
  for (InputCopy& cp : copies) cp.d_table = to_device(cp.map.table);

  const std::int64_t T = m.num_tokens;
  const std::int32_t max_blocks = copies[0].map.max_blocks;
  DeviceBuffer iq(std::size_t(T * H * kHeadDim * 2)), topk(std::size_t(T * H * K) * sizeof(std::int32_t));
  fill_random(iq.get(), T * H * kHeadDim, DType::bf16, 1.0f, s.seed + 2, stream);
  const std::size_t ws_bytes = cuda::index_workspace_bytes(std::int32_t(T), H, max_blocks);
  DeviceBuffer ws(ws_bytes);
  std::vector<IndexerArgs> args(copies.size());
  for (std::size_t i = 0; i < copies.size(); ++i) {
    IndexerArgs& a = args[i];
    a.index_q = iq.get();
    a.iq_dtype = DType::bf16;
    a.num_kv_heads = H;
    a.init_blocks = 0;
    a.local_blocks = 1;
    a.cache = cache;
    a.block_table = BlockTable{copies[i].d_table.as<std::int32_t>(), m.num_requests, max_blocks, max_blocks};
    a.out = TopkView::token_major(topk.as<std::int32_t>(), H, K);
  }
  res.traffic = mean_traffic(copies);
  res.device_bytes = double(pool.bytes() + iq.bytes() + topk.bytes() + ws.bytes());
  for (const InputCopy& cp : copies) res.device_bytes += double(cp.d_table.bytes());
  time_case([&](int i) { cuda::index(st.view, args[std::size_t(i)], max_blocks, {ws.get(), ws_bytes}, stream); },
            res.copies, s, stream, res);
}

}  // namespace

BenchResult run_bench_case(const BenchCase& c, const BenchSettings& s, cuda::Stream stream) {
  BenchResult res;
  res.c = c;
  try {
    if (c.op == BenchOp::attend) bench_attend(c, s, stream, res);
    else bench_index(c, s, stream, res);
  } catch (const std::exception& e) {
    res.error = e.what();
    res.time = TimeStats{};
  }
  return res;
}

}  // namespace msa::tool
