// A layer case of `msa bench`: one engine step of one sparse layer.
//
// Stages, in the order of the step: insert (cuda::insert_kv and
// cuda::insert_index of the step's new tokens), index (cuda::index: block
// scores and top-k) and attend (cuda::attend with a plan made once per case,
// over the top-k the index stage just wrote). Each stage alone, then the
// whole step, is captured in a CUDA graph per input copy and timed.
//
// Inputs, per rotated copy (bench_case.cpp's rotation beyond L2): an index
// cache with a page for every block of every request and its block table; a
// KV cache holding the blocks the copy's indexer selects (and the new tokens'
// blocks, which it always selects), every other block mapped to one shared
// page, and its block table; the two slot arrays and the copy's top-k buffer.
// Shared: the index queries, queries, the new tokens' K, V and index keys, the
// output and the workspaces. Index keys and queries come from
// bench_directed.hpp, so that the indexer selects runs of neighbouring blocks
// (clustered pattern). The KV page maps follow the selections, which the
// setup runs the step's insert and index for, eagerly, copy by copy, and reads
// back; the attend traffic is counted on those very lists.
#include "bench_layer.hpp"

#include <algorithm>
#include <vector>

#include "bench_directed.hpp"
#include "bench_directed_fill.hpp"
#include "bench_step.hpp"
#include "device_memory.hpp"
#include "fill.hpp"
#include "msa/error.hpp"
#include "rng.hpp"

namespace msa::tool {

namespace {

struct LayerCopy {
  PageMap index_map, kv_map;
  std::int64_t index_first = 0, kv_first = 0;  // first pages in the two pools
  std::vector<std::int32_t> topk;              // [num_tokens, num_kv_heads, topk] as the indexer wrote it
  Traffic attend;
  DeviceBuffer d_index_table, d_index_slots, d_kv_table, d_kv_slots, d_topk;
  IndexerArgs index_args;
  InsertIndexArgs insert_index_args;
  InsertKVArgs insert_kv_args;
  AttentionArgs attend_args;
};

StageResult time_stage(const std::function<void(int)>& body, const Traffic& traffic, int copies,
                       const BenchSettings& s, cuda::Stream stream) {
  const TimedRun run = time_graphs(body, copies, s, stream);
  StageResult r;
  r.time = run.time;
  r.traffic = traffic;
  r.graph = run.graph;
  return r;
}

}  // namespace

void bench_layer(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res) {
  Step st;
  make_step(c, st);
  const BatchMetadata& m = st.meta;
  const int H = c.num_kv_heads, QH = c.num_q_heads, K = c.topk;
  const std::int64_t T = m.num_tokens;
  const ScaleMode mode = kv_scale_mode(c.dtype, s);
  const DType index_dtype = c.index_dtype, iq_dtype = index_query_dtype(index_dtype);
  const TopkPattern pattern = case_pattern(c, s.pattern);
  const std::int64_t per_request = groups_per_request(m.seq_lens);
  res.iq_dtype = iq_dtype;

  const Traffic insert_t = insert_traffic(T, H, c.dtype, mode, index_dtype);
  const Traffic index_t = index_traffic(m.query_start, m.seq_lens, H, index_dtype, c.prefill);
  // The index stage reads every block and the attention at most as much
  // again: copies sized on what a replay surely reads span >= 4x L2.
  res.copies = rotation_copies(insert_t.bytes + index_t.bytes, bench_copy_bytes_bound(c), s.l2_bytes, s.memory_budget);
  std::vector<LayerCopy> copies(std::size_t(res.copies));

  // The index caches: every block its own page, keys along the blocks' groups.
  std::int64_t index_pages = 0;
  std::vector<std::int64_t> groups;  // [index_pages]
  for (LayerCopy& cp : copies) {
    cp.index_first = index_pages;
    cp.index_map = map_pages(m.query_start, m.seq_lens, {}, H, K, true, cp.index_first);
    index_pages += cp.index_map.pages;
    if (pattern == TopkPattern::clustered) {
      const std::vector<std::int64_t> g = page_groups(cp.index_map, cp.index_first, per_request);
      groups.insert(groups.end(), g.begin(), g.end());
    }
  }
  const std::int32_t max_blocks = copies[0].index_map.max_blocks;
  DeviceBuffer index_pool(std::size_t(index_pages * index_page_bytes(index_dtype)));
  const DeviceBuffer d_groups = to_device(groups);
  const DirectedFill keys{kKeyNoise, kKeyAmp, mix64(s.seed * 31 + 1), mix64(s.seed * 31 + 2)};
  fill_directed(index_pool.get(), index_pages * kBlockSize, index_dtype, groups.empty() ? nullptr : d_groups.as<std::int64_t>(),
                1, kBlockSize, keys, stream);
  const IndexCacheView index_cache = make_index_cache_view(index_dtype, index_pool.get(), index_pages);

  // Shared inputs: index queries along their rows' groups, the new tokens'
  // index keys along their blocks' groups, random K, V and queries.
  const std::vector<std::int64_t> qgroups =
      query_groups(m.query_start, m.seq_lens, H, c.prefill, pattern, per_request, mix64(s.seed * 31 + 3));
  const DeviceBuffer d_qgroups = to_device(qgroups);
  DeviceBuffer iq(std::size_t(T * H * kHeadDim) * dtype_bytes(iq_dtype));
  fill_directed(iq.get(), T * H, iq_dtype, pattern == TopkPattern::clustered ? d_qgroups.as<std::int64_t>() : nullptr,
                kQueryGroups, 1, DirectedFill{kQueryNoise, kQueryAmp, mix64(s.seed * 31 + 4), keys.direction_seed},
                stream);
  const std::vector<std::int64_t> tgroups = token_groups(m.query_start, m.seq_lens, per_request);
  const DeviceBuffer d_tgroups = to_device(tgroups);
  DeviceBuffer new_index_k(std::size_t(T * kHeadDim * 2));
  fill_directed(new_index_k.get(), T, DType::bf16, pattern == TopkPattern::clustered ? d_tgroups.as<std::int64_t>() : nullptr,
                1, 1, DirectedFill{kKeyNoise, kKeyAmp, mix64(s.seed * 31 + 5), keys.direction_seed}, stream);
  DeviceBuffer new_k(std::size_t(T * H * kHeadDim * 2)), new_v(std::size_t(T * H * kHeadDim * 2));
  fill_random(new_k.get(), T * H * kHeadDim, DType::bf16, 1.0f, s.seed + 6, stream);
  fill_random(new_v.get(), T * H * kHeadDim, DType::bf16, 1.0f, s.seed + 7, stream);
  DeviceBuffer q(std::size_t(T * QH * kHeadDim * 2)), out(std::size_t(T * QH * kHeadDim * 2));
  fill_random(q.get(), T * QH * kHeadDim, DType::bf16, 1.0f, s.seed + 1, stream);
  const std::size_t index_ws_bytes =
      index_workspace_bytes(s, std::int32_t(T), H, max_blocks, index_dtype, m.num_prefills);
  DeviceBuffer index_ws(index_ws_bytes);

  // The insert and the index of every copy, eagerly, and its selections.
  for (LayerCopy& cp : copies) {
    cp.d_index_table = to_device(cp.index_map.table);
    cp.d_index_slots = to_device(step_slots(m.query_start, m.seq_lens, cp.index_map));
    cp.d_topk = DeviceBuffer(std::size_t(T * H * K) * sizeof(std::int32_t));
    cp.insert_index_args.index_k = new_index_k.get();
    cp.insert_index_args.src_dtype = DType::bf16;
    cp.insert_index_args.slots = cp.d_index_slots.as<std::int64_t>();
    cp.insert_index_args.num_tokens = T;
    IndexerArgs& a = cp.index_args;
    a.index_q = iq.get();
    a.iq_dtype = iq_dtype;
    a.num_kv_heads = H;
    a.init_blocks = 0;
    a.local_blocks = 1;
    a.cache = index_cache;
    a.block_table = BlockTable{cp.d_index_table.as<std::int32_t>(), m.num_requests, max_blocks, max_blocks};
    a.out = TopkView::token_major(cp.d_topk.as<std::int32_t>(), H, K);
    cuda::insert_index(index_cache, cp.insert_index_args, stream);
    cuda::index(st.view, a, max_blocks, {index_ws.get(), index_ws_bytes}, stream);
  }
  sync_stream(stream);
  double fraction = 0.0;
  std::vector<Traffic> attend_t;
  std::int64_t kv_pages = 0;
  for (LayerCopy& cp : copies) {
    cp.topk = to_host<std::int32_t>(cp.d_topk, std::size_t(T * H * K));
    cp.kv_first = kv_pages;
    cp.kv_map = map_pages(m.query_start, m.seq_lens, cp.topk, H, K, false, cp.kv_first);
    kv_pages += cp.kv_map.pages;
    cp.attend = attend_traffic(m.query_start, m.seq_lens, cp.topk, H, QH / H, K, kv_block_bytes(c.dtype, mode));
    attend_t.push_back(cp.attend);
    fraction += group_selection_fraction(m.query_start, m.seq_lens, cp.topk, H, K, qgroups, per_request);
  }
  res.group_fraction = pattern == TopkPattern::clustered ? fraction / double(copies.size()) : -1.0;

  // The KV caches over the selected blocks, and the attention.
  const KvPool kv = make_kv_pool(c.dtype, mode, kv_pages, H, s.seed, stream);
  const AttendPlan plan = make_attend_plan(c, s, m, mode, stream);
  for (LayerCopy& cp : copies) {
    cp.d_kv_table = to_device(cp.kv_map.table);
    cp.d_kv_slots = to_device(step_slots(m.query_start, m.seq_lens, cp.kv_map));
    cp.insert_kv_args.k = new_k.get();
    cp.insert_kv_args.v = new_v.get();
    cp.insert_kv_args.src_dtype = DType::bf16;
    cp.insert_kv_args.slots = cp.d_kv_slots.as<std::int64_t>();
    cp.insert_kv_args.num_tokens = T;
    cp.attend_args = make_attend_args(c, q.get(), out.get(), cp.d_topk.as<std::int32_t>(), kv.cache,
                                      cp.d_kv_table.as<std::int32_t>(), m.num_requests, cp.kv_map.max_blocks);
  }

  res.device_bytes = kv.bytes() + double(index_pool.bytes() + d_groups.bytes() + d_qgroups.bytes() + iq.bytes() +
                                         d_tgroups.bytes() + new_index_k.bytes() + new_k.bytes() + new_v.bytes() +
                                         q.bytes() + out.bytes() + index_ws.bytes() + plan.workspace.bytes());
  for (const LayerCopy& cp : copies)
    res.device_bytes += double(cp.d_index_table.bytes() + cp.d_index_slots.bytes() + cp.d_kv_table.bytes() +
                               cp.d_kv_slots.bytes() + cp.d_topk.bytes());

  auto insert = [&](int i) {
    const LayerCopy& cp = copies[std::size_t(i)];
    cuda::insert_kv(kv.cache, cp.insert_kv_args, stream);
    cuda::insert_index(index_cache, cp.insert_index_args, stream);
  };
  auto index = [&](int i) {
    cuda::index(st.view, copies[std::size_t(i)].index_args, max_blocks, {index_ws.get(), index_ws_bytes}, stream);
  };
  auto attend = [&](int i) { cuda::attend(plan.plan, st.view, copies[std::size_t(i)].attend_args, stream); };
  // The light stages first, right after the settle, and the heavy index
  // next to the whole step, so that no short timing follows heavy work (the
  // clocks stay lowered for a while after it).
  const Traffic attend_mean = mean_traffic(attend_t);
  res.stages[int(LayerStage::insert)] = time_stage(insert, insert_t, res.copies, s, stream);
  res.stages[int(LayerStage::attend)] = time_stage(attend, attend_mean, res.copies, s, stream);
  res.stages[int(LayerStage::index)] = time_stage(index, index_t, res.copies, s, stream);
  const TimedRun layer = time_graphs(
      [&](int i) {
        insert(i);
        index(i);
        attend(i);
      },
      res.copies, s, stream);
  res.time = layer.time;
  res.graph = layer.graph;
  res.note = layer.note;
  res.traffic = insert_t + index_t + attend_mean;
}

}  // namespace msa::tool
