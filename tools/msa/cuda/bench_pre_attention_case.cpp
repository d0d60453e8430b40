#include "bench_pre_attention_case.hpp"

#include <algorithm>
#include <vector>

#include "bench_pre_attention.hpp"
#include "bench_step.hpp"
#include "copy_floor.hpp"
#include "device_memory.hpp"
#include "fill.hpp"
#include "msa/error.hpp"
#include "msa/pre_attention.hpp"
#include "rng.hpp"

namespace msa::tool {
namespace {

// A copy of `bytes` on the SMs per replay (copy_floor.hpp), over `copies`
// rotated source / destination pairs, timed like the case.
TimeStats time_copy_floor(std::size_t bytes, int copies, const BenchSettings& s, cuda::Stream stream) {
  std::vector<DeviceBuffer> from, to;
  for (int i = 0; i < copies; ++i) {
    from.emplace_back(bytes);
    to.emplace_back(bytes);
  }
  const auto copy = [&](int i) {
    copy_on_sms(to[std::size_t(i)].get(), from[std::size_t(i)].get(), bytes, stream);
  };
  return time_graphs(copy, copies, s, stream).time;
}

}  // namespace

void bench_pre_attention(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res) {
  const std::int64_t N = c.num_tokens();
  const int nq = c.num_q_heads, H = c.num_kv_heads, niq = H;
  const ScaleMode mode = kv_scale_mode(c.dtype, s);
  const std::int64_t heads = std::int64_t(nq) + 2 * H + niq + 1;
  const std::int64_t pages_per_copy = (N + kBlockSize - 1) / kBlockSize;
  const std::int64_t index_page_bytes = std::int64_t(kBlockSize) * kHeadDim * 2;
  res.traffic = pre_attention_traffic(c, mode);
  const double page_bytes = double(H) * double(kv_block_bytes(c.dtype, mode)) + double(index_page_bytes);
  const double copy_bytes = double(N * heads * kHeadDim * 2) + double(pages_per_copy) * page_bytes;
  res.copies = rotation_copies(res.traffic.bytes, copy_bytes, s.l2_bytes, s.memory_budget);
  const std::int64_t pages = pages_per_copy * res.copies;

  // Shared: positions, weights, the rope table, the outputs.
  const std::int64_t max_position = std::max<std::int64_t>(N, 1);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(N));
  for (std::int64_t t = 0; t < N; ++t) positions[std::size_t(t)] = t;
  std::vector<float> table(static_cast<std::size_t>(max_position * kRopeDims));
  make_rope_table(kM3RopeTheta, max_position, table.data());
  const DeviceBuffer d_positions = to_device(positions), d_table = to_device(table);
  DeviceBuffer weights(4 * kHeadDim * sizeof(float));
  fill_random(weights.get(), 4 * kHeadDim, DType::f32, 0.3f, s.seed + 5, stream);
  DeviceBuffer q(std::size_t(N * nq * kHeadDim * 2)), iq(std::size_t(N * niq * kHeadDim * 2));

  // Per copy: qkv rows, and slots into the copy's own (shuffled) pages of one pool.
  std::vector<DeviceBuffer> qkv, slots;
  for (int i = 0; i < res.copies; ++i) {
    qkv.emplace_back(std::size_t(N * heads * kHeadDim * 2));
    fill_random(qkv.back().get(), N * heads * kHeadDim, DType::bf16, 1.0f, s.seed * 131 + std::uint64_t(i), stream);
    std::vector<std::int64_t> page(static_cast<std::size_t>(pages_per_copy));
    for (std::int64_t p = 0; p < pages_per_copy; ++p) page[std::size_t(p)] = i * pages_per_copy + p;
    Rng rng(mix64(s.seed * 977 + std::uint64_t(i)));
    rng.shuffle(page);
    std::vector<std::int64_t> slot(static_cast<std::size_t>(N));
    for (std::int64_t t = 0; t < N; ++t)
      slot[std::size_t(t)] = page[std::size_t(t / kBlockSize)] * kBlockSize + t % kBlockSize;
    slots.push_back(to_device(slot));
  }
  const KvPool pool = make_kv_pool(c.dtype, mode, pages, H, s.seed, stream);
  DeviceBuffer index_pool(std::size_t(pages * index_page_bytes));
  const IndexCacheView index_cache = make_index_cache_view(DType::bf16, index_pool.get(), pages);

  std::vector<PreAttentionArgs> args(std::size_t(res.copies));
  for (int i = 0; i < res.copies; ++i) {
    PreAttentionArgs& a = args[std::size_t(i)];
    a.qkv = qkv[std::size_t(i)].get();
    a.qkv_dtype = DType::bf16;
    a.num_tokens = N;
    a.num_q_heads = nq;
    a.num_kv_heads = H;
    a.num_index_heads = niq;
    a.positions = d_positions.as<std::int64_t>();
    a.q_weight = weights.as<float>();
    a.k_weight = weights.as<float>() + kHeadDim;
    a.index_q_weight = weights.as<float>() + 2 * kHeadDim;
    a.index_k_weight = weights.as<float>() + 3 * kHeadDim;
    a.cos_sin = d_table.get();
    a.max_position = max_position;
    a.q = q.get();
    a.index_q = iq.get();
    a.slots = slots[std::size_t(i)].as<std::int64_t>();
  }
  res.device_bytes = pool.bytes() + double(index_pool.bytes() + q.bytes() + iq.bytes() + d_table.bytes());
  for (int i = 0; i < res.copies; ++i)
    res.device_bytes += double(qkv[std::size_t(i)].bytes() + slots[std::size_t(i)].bytes());

  const auto direct = [&](int i) { cuda::pre_attention(pool.cache, index_cache, args[std::size_t(i)], stream); };
  const TimedRun run = time_graphs(direct, res.copies, s, stream);
  res.time = run.time;
  res.graph = run.graph;
  res.note = run.note;
  // Then what a copy of the step's bytes takes at this size.
  const std::size_t half = std::size_t(res.traffic.bytes / 2.0) / 16 * 16 + 16;
  res.copy_floor = time_copy_floor(half, res.copies, s, stream);
  res.device_bytes += 2.0 * double(half) * res.copies;
}

}  // namespace msa::tool
