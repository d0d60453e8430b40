// A decode step on the GPU, captured once in a CUDA graph and replayed, as an
// engine's decode loop does: the attention is planned once for the batch's
// shape, insert + index + attend are recorded in one graph, and every step
// copies its new queries, keys, slots and sequence lengths into the same device
// buffers and replays the graph. Four requests decode one token per step for
// three steps; the last step is checked against the CPU engine.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu_util.hpp"
#include "msa/config.hpp"
#include "msa/cpu.hpp"
#include "msa/cuda.hpp"
#include "msa/slots.hpp"

using namespace example;

int main() try {
  if (msa::cuda::device_count() == 0) return std::printf("no CUDA device (this example needs sm_90a)\n"), 2;
  const msa::ModelConfig model = msa::ModelConfig::minimax_m3(4);  // 16 query heads, 1 KV head
  const int H = model.num_kv_heads, QH = model.num_q_heads, D = msa::kHeadDim, steps = 3;
  const std::vector<std::int32_t> context = {1000, 5000, 127, 20000};  // cached before step 0
  const std::int32_t R = 4, T = R, max_blocks = (20000 + steps + 127) / 128;  // one token per request

  // Block table [R, max_blocks] with room for every step; pages handed out from the top.
  std::vector<std::int32_t> table(std::size_t(R) * max_blocks, -1);
  std::int32_t pages = 0;
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t b = 0; b * 128 < context[r] + steps; ++b) table[r * max_blocks + b] = pages++;
  for (std::int32_t& p : table) p = p < 0 ? -1 : pages - 1 - p;
  const msa::BlockTable host_table{table.data(), R, max_blocks, max_blocks};
  const msa::BlockTable device_table{to_device(table), R, max_blocks, max_blocks};

  // Device caches full of random values (the cached context); the step's buffers.
  msa::KVCacheView cache = msa::make_cache_view(msa::DType::bf16, nullptr, pages, H, msa::Layout::hnd);
  const std::size_t kv_elems = std::size_t(msa::cache_extent(cache));  // [pages, H, 128, 256]
  cache = msa::make_cache_view(msa::DType::bf16, to_device(random_bf16(kv_elems)), pages, H, msa::Layout::hnd);
  const msa::IndexCacheView index_cache{msa::DType::bf16, to_device(random_bf16(pages * 128 * D)), pages};
  bf16* q = device_alloc<bf16>(T * QH * D);        // [T, QH, 128]
  bf16* index_q = device_alloc<bf16>(T * H * D);   // [T, H, 128]
  bf16* k = device_alloc<bf16>(T * H * D);         // [T, H, 128], V likewise
  bf16* v = device_alloc<bf16>(T * H * D);
  bf16* index_k = device_alloc<bf16>(T * D);       // [T, 128]
  std::int64_t* slots = device_alloc<std::int64_t>(T);
  std::int32_t* topk = device_alloc<std::int32_t>(T * H * model.topk);  // [T, H, topk]
  bf16* out = device_alloc<bf16>(T * QH * D);                           // [T, QH, 128]
  float* lse = device_alloc<float>(T * QH);                             // [T, QH]

  // The step as the kernels see it: query_start and token_request stay, seq_lens grow.
  auto meta_of = [&](int s) {
    msa::BatchSpec spec{std::vector<std::int32_t>(R, 1), context};
    for (std::int32_t& n : spec.seq_lens) n += s + 1;
    return msa::build_metadata(spec);
  };
  msa::BatchMetadata meta = meta_of(0);
  std::int32_t* seq_lens = to_device(meta.seq_lens);
  msa::StepView step = meta.view();
  step.query_start = to_device(meta.query_start), step.token_request = to_device(meta.token_request);
  step.seq_lens = seq_lens;
  const msa::IndexerArgs index{.index_q = index_q, .num_kv_heads = H, .init_blocks = model.init_blocks,
                               .local_blocks = model.local_blocks, .cache = index_cache,
                               .block_table = device_table, .out = msa::TopkView::token_major(topk, H, model.topk)};
  const msa::AttentionArgs attention{.q = q, .out = out, .lse = lse, .num_q_heads = QH,
                                     .softmax_scale = model.softmax_scale, .topk = index.out,
                                     .cache = cache, .block_table = device_table};

  // Plan once (workspaces: the attention plan's, the indexer's block scores), capture once.
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream));
  const msa::cuda::AttentionShape shape{.num_q_heads = QH, .num_kv_heads = H, .topk = model.topk};
  const std::size_t plan_bytes = msa::cuda::attention_workspace_bytes(meta, shape);
  const std::size_t index_bytes = msa::cuda::index_workspace_bytes(T, H, max_blocks);
  void* plan_ws = device_alloc<char>(plan_bytes);
  void* index_ws = device_alloc<char>(index_bytes);
  const msa::cuda::AttentionPlan plan = msa::cuda::plan_attention(meta, shape, plan_ws, plan_bytes, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  msa::cuda::insert_kv(cache, {k, v, msa::DType::bf16, slots, T}, stream);
  msa::cuda::insert_index(index_cache, {index_k, msa::DType::bf16, slots, T}, stream);
  msa::cuda::index(step, index, max_blocks, index_ws, index_bytes, stream);
  msa::cuda::attend(plan, step, attention, stream);
  cuda_ok(cudaStreamEndCapture(stream, &graph));
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<bf16> q_host;
  for (int s = 0; s < steps; ++s) {  // the decode loop: new inputs, one replay
    meta = meta_of(s);
    upload(q, q_host = random_bf16(T * QH * D), stream);
    for (bf16* x : {k, v, index_q}) upload(x, random_bf16(T * H * D), stream);
    upload(index_k, random_bf16(T * D), stream);
    upload(slots, msa::step_slots(meta, host_table), stream);
    upload(seq_lens, meta.seq_lens, stream);
    cuda_ok(cudaGraphLaunch(exec, stream));
    cuda_ok(cudaStreamSynchronize(stream));
    std::printf("step %d: request 2 at seq_len %d selects blocks", s, meta.seq_lens[2]);
    for (std::int32_t b : download(topk + 2 * H * model.topk, model.topk)) std::printf(" %d", b);
    std::printf("\n");
  }

  // The CPU engine on copies of the cache, with the same top-k and queries.
  std::vector<bf16> kv_host = download(static_cast<bf16*>(cache.k), kv_elems);
  std::vector<std::int32_t> topk_host = download(topk, std::size_t(T) * H * model.topk);
  std::vector<bf16> want(std::size_t(T) * QH * D);
  std::vector<float> want_lse(std::size_t(T) * QH);
  msa::AttentionArgs cpu = attention;
  cpu.q = q_host.data(), cpu.out = want.data(), cpu.lse = want_lse.data(), cpu.block_table = host_table;
  cpu.topk = msa::TopkView::token_major(topk_host.data(), H, model.topk);
  cpu.cache = msa::make_cache_view(msa::DType::bf16, kv_host.data(), pages, H, msa::Layout::hnd);
  msa::cpu::attend(meta.view(), cpu);
  const double out_err = max_error(download(out, want.size()), want);
  const double lse_err = max_error(download(lse, want_lse.size()), want_lse);
  const bool ok = out_err < 1e-2 && lse_err < 1e-3;
  std::printf("last step against the CPU engine: max |out error| %.1e, max |lse error| %.1e: %s\n", out_err,
              lse_err, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
} catch (const std::exception& e) {  // msa::Error included
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
