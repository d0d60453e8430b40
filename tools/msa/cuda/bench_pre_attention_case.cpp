#include "bench_pre_attention_case.hpp"

#include <algorithm>
#include <vector>

#include "bench_pre_attention.hpp"
#include "device_memory.hpp"
#include "fill.hpp"
#include "msa/error.hpp"
#include "msa/pre_attention.hpp"
#include "rng.hpp"
#include "timer.hpp"

namespace msa::tool {

void bench_pre_attention(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res) {
  const std::int64_t N = c.num_tokens();
  const int nq = c.num_q_heads, H = c.num_kv_heads, niq = H;
  const ScaleMode mode = !is_fp8(c.dtype)  ? (c.dtype == DType::nvfp4 ? ScaleMode::per_tensor : ScaleMode::none)
                         : s.token_scales ? ScaleMode::per_token_head
                                          : ScaleMode::per_tensor;
  const std::int64_t heads = std::int64_t(nq) + 2 * H + niq + 1;
  const std::int64_t pages_per_copy = (N + kBlockSize - 1) / kBlockSize;
  const std::int64_t page_bytes =
      c.dtype == DType::nvfp4 ? 2 * H * nvfp4::kSlotBytes
                              : std::int64_t(H) * kBlockSize * 2 * kHeadDim * std::int64_t(dtype_bytes(c.dtype));
  const std::int64_t index_page_bytes = std::int64_t(kBlockSize) * kHeadDim * 2;
  res.traffic = pre_attention_traffic(c, mode);
  const double copy_bytes = double(N * heads * kHeadDim * 2) + double(pages_per_copy * (page_bytes + index_page_bytes));
  res.copies = rotation_copies(res.traffic.bytes, copy_bytes, s.l2_bytes, s.memory_budget);
  const std::int64_t pages = pages_per_copy * res.copies;

  // Shared: positions, weights, the rope table, the outputs.
  const std::int64_t max_position = std::max<std::int64_t>(N, 1);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(N));
  for (std::int64_t t = 0; t < N; ++t) positions[std::size_t(t)] = t;
  std::vector<float> table(std::size_t(max_position * kRopeDims));
  make_rope_table(kM3RopeTheta, max_position, table.data());
  const DeviceBuffer d_positions = to_device(positions), d_table = to_device(table);
  DeviceBuffer weights(4 * kHeadDim * sizeof(float));
  fill_random(weights.get(), 4 * kHeadDim, DType::f32, 0.3f, s.seed + 5, stream);
  DeviceBuffer q(std::size_t(N * nq * kHeadDim * 2)), iq(std::size_t(N * niq * kHeadDim * 2));

  // Per copy: qkv rows and slots into the copy's own (shuffled) pages of one pool.
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
  DeviceBuffer pool(std::size_t(pages * page_bytes)), index_pool(std::size_t(pages * index_page_bytes));
  pool.fill_bytes(0);
  index_pool.fill_bytes(0);
  KVCacheView cache;
  if (c.dtype == DType::nvfp4) {
    cache = make_nvfp4_cache_view(pool.get(), pages, H, 1.0f / 64, 1.0f / 64);
  } else {
    cache = make_cache_view(c.dtype, pool.get(), pages, H, Layout::hnd);
    cache.scale_mode = mode;
    if (mode == ScaleMode::per_tensor) cache.k_scale = cache.v_scale = 1.0f / 16;
  }
  DeviceBuffer k_scales, v_scales;
  if (mode == ScaleMode::per_token_head) {
    k_scales = DeviceBuffer(std::size_t(pages * kBlockSize * H) * sizeof(float));
    v_scales = DeviceBuffer(k_scales.bytes());
    cache.k_scales = k_scales.as<float>();
    cache.v_scales = v_scales.as<float>();
  }
  IndexCacheView index_cache;
  index_cache.dtype = DType::bf16;
  index_cache.base = index_pool.get();
  index_cache.num_pages = pages;

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
  res.device_bytes = double(pool.bytes() + index_pool.bytes() + k_scales.bytes() + v_scales.bytes() + q.bytes() +
                            iq.bytes() + d_table.bytes());
  for (int i = 0; i < res.copies; ++i) res.device_bytes += double(qkv[std::size_t(i)].bytes() + slots[std::size_t(i)].bytes());

  auto direct = [&](int i) {
    cuda::pre_attention(cache, index_cache, args[std::size_t(i % res.copies)], stream);
  };
  direct(0);  // loads the kernel, catches argument errors
  sync_stream(stream);
  std::vector<GraphExec> graphs;
  for (int i = 0; i < res.copies; ++i) graphs.emplace_back([&, i] { direct(i); }, stream);
  auto launch = [&](int i) { graphs[std::size_t(i % res.copies)].launch(stream); };
  const TimeStats pilot = summarize_ms(time_replays(launch, res.copies, 3, stream));
  int n = s.iters;
  if (pilot.median_us > 0.0) n = std::min(n, std::max(10, int(s.budget_ms * 1e3 / pilot.median_us)));
  res.time = summarize_ms(time_replays(launch, s.warmup, std::max(n, 1), stream));
  res.graph = true;
}

}  // namespace msa::tool
