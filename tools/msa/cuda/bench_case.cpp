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
// to the caches, or written). Layer cases: bench_layer.cpp.
#include "bench_case.hpp"

#include <algorithm>
#include <functional>
#include <vector>

#include "bench_layer.hpp"
#include "bench_step.hpp"
#include "bench_pre_attention_case.hpp"
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

// One rotated input set.
struct InputCopy {
  std::vector<std::int32_t> topk;  // [num_tokens, H, topk] (attend only)
  PageMap map;
  std::int64_t first_page = 0;
  Traffic traffic;
  DeviceBuffer d_topk, d_table;
};

Traffic mean_traffic(const std::vector<InputCopy>& copies) {
  std::vector<Traffic> t;
  for (const InputCopy& c : copies) t.push_back(c.traffic);
  return mean_traffic(t);
}

// The graph timing of a run step into res (time, graph, note).
void time_case(const std::function<void(int)>& direct, int copies, const BenchSettings& s, cuda::Stream stream,
               BenchResult& res) {
  const TimedRun run = time_graphs(direct, copies, s, stream);
  res.time = run.time;
  res.graph = run.graph;
  res.note = run.note;
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
  const ScaleMode mode = kv_scale_mode(c.dtype, s);
  const TopkPattern pattern = case_pattern(c, s.pattern);
  // The pool holds the K / V data; per-token scales live in their own arrays
  // (their bytes count in the traffic, not in the read floor).
  const std::int64_t data_block_bytes = kv_block_bytes(c.dtype, is_fp8(c.dtype) ? ScaleMode::per_tensor : mode);
  const std::int64_t page_bytes = data_block_bytes * H;

  std::vector<InputCopy> copies;
  auto add_copy = [&](int i) {
    InputCopy cp;
    cp.first_page = copies.empty() ? 0 : copies.back().first_page + copies.back().map.pages;
    cp.topk = case_topk(c, m, pattern, s.seed, i);
    cp.map = map_pages(m.query_start, m.seq_lens, cp.topk, H, K, false, cp.first_page);
    cp.traffic = attend_traffic(m.query_start, m.seq_lens, cp.topk, H, QH / H, K, kv_block_bytes(c.dtype, mode));
    copies.push_back(std::move(cp));
  };
  add_copy(0);
  res.copies = rotation_copies(copies[0].traffic.bytes, double(copies[0].map.pages * page_bytes), s.l2_bytes,
                               s.memory_budget);
  for (int i = 1; i < res.copies; ++i) add_copy(i);
  const std::int64_t pages = copies.back().first_page + copies.back().map.pages;

  const KvPool kv = make_kv_pool(c.dtype, mode, pages, H, s.seed, stream);
  for (InputCopy& cp : copies) {
    cp.d_topk = to_device(cp.topk);
    cp.d_table = to_device(cp.map.table);
  }
  const std::int64_t T = m.num_tokens;
  DeviceBuffer q(std::size_t(T * QH * kHeadDim * 2)), out(std::size_t(T * QH * kHeadDim * 2));
  fill_random(q.get(), T * QH * kHeadDim, DType::bf16, 1.0f, s.seed + 1, stream);

  const AttendPlan plan = make_attend_plan(c, s, m, mode, stream);
  std::vector<AttentionArgs> args;
  for (const InputCopy& cp : copies)
    args.push_back(make_attend_args(c, q.get(), out.get(), cp.d_topk.as<std::int32_t>(), kv.cache,
                                    cp.d_table.as<std::int32_t>(), m.num_requests, cp.map.max_blocks));
  res.traffic = mean_traffic(copies);
  res.device_bytes = kv.bytes() + double(q.bytes() + out.bytes() + plan.workspace.bytes());
  for (const InputCopy& cp : copies) res.device_bytes += double(cp.d_topk.bytes() + cp.d_table.bytes());
  time_case([&](int i) { cuda::attend(plan.plan, st.view, args[std::size_t(i)], stream); }, res.copies, s, stream, res);
  if (!c.prefill) time_read_floor(c, m, copies, kv.data, data_block_bytes, page_bytes, s, stream, res);
}

void bench_index(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res) {
  Step st;
  make_step(c, st);
  const BatchMetadata& m = st.meta;
  const int H = c.num_kv_heads, K = c.topk;
  const std::int64_t page_bytes = index_page_bytes(c.dtype);
  // An fp8 cache is scored with an fp8 query (the same plain cast); bf16 otherwise.
  const DType iq_dtype = index_query_dtype(c.dtype);

  std::vector<InputCopy> copies;
  auto add_copy = [&] {
    InputCopy cp;
    cp.first_page = copies.empty() ? 0 : copies.back().first_page + copies.back().map.pages;
    cp.map = map_pages(m.query_start, m.seq_lens, {}, H, K, true, cp.first_page);
    cp.traffic = index_traffic(m.query_start, m.seq_lens, H, c.dtype, c.prefill);
    copies.push_back(std::move(cp));
  };
  add_copy();
  res.copies = rotation_copies(copies[0].traffic.bytes, double(copies[0].map.pages * page_bytes), s.l2_bytes,
                               s.memory_budget);
  for (int i = 1; i < res.copies; ++i) add_copy();
  const std::int64_t pages = copies.back().first_page + copies.back().map.pages;

  DeviceBuffer pool(std::size_t(pages * page_bytes));
  // bf16 / fp8: unit-variance features; nvfp4: random codes under valid e4m3 scales of about 1.
  if (c.dtype == DType::bf16) fill_random(pool.get(), pages * page_bytes / 2, DType::bf16, 1.0f, s.seed, stream);
  else fill_random(pool.get(), pages * page_bytes, DType::fp8_e4m3, 1.0f, s.seed, stream);
  const IndexCacheView cache = make_index_cache_view(c.dtype, pool.get(), pages, 0, 1.0f / 64);
  for (InputCopy& cp : copies) cp.d_table = to_device(cp.map.table);

  const std::int64_t T = m.num_tokens;
  const std::int32_t max_blocks = copies[0].map.max_blocks;
  DeviceBuffer iq(std::size_t(T * H * kHeadDim) * dtype_bytes(iq_dtype)),
      topk(std::size_t(T * H * K) * sizeof(std::int32_t));
  fill_random(iq.get(), T * H * kHeadDim, iq_dtype, 1.0f, s.seed + 2, stream);
  const std::size_t ws_bytes = index_workspace_bytes(s, std::int32_t(T), H, max_blocks, c.dtype, m.num_prefills);
  DeviceBuffer ws(ws_bytes);
  std::vector<IndexerArgs> args(copies.size());
  for (std::size_t i = 0; i < copies.size(); ++i) {
    IndexerArgs& a = args[i];
    a.index_q = iq.get();
    a.iq_dtype = iq_dtype;
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
    else if (c.op == BenchOp::index) bench_index(c, s, stream, res);
    else if (c.op == BenchOp::pre_attention) bench_pre_attention(c, s, stream, res);
    else bench_layer(c, s, stream, res);
  } catch (const std::exception& e) {
    res.error = e.what();
    res.time = TimeStats{};
  }
  return res;
}

}  // namespace msa::tool
