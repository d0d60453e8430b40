// A chunked prefill on the GPU with key-major attention. One request's prompt
// of 8,192 tokens is prefilled in four chunks of 2,048; each chunk is one
// engine step: insert its K, V and index keys, index (every token selects 16
// blocks of the request up to its own position), attend. Key-major order
// (AttentionShape::prefill_order) inverts the top-k lists into the k2q plan
// (per KV head and block, the tokens that selected it), so that each block is
// loaded once for all of them. The example also builds that plan with
// cuda::build_k2q to show how many tokens share each block, and checks the last
// chunk against the CPU engine.
#include <algorithm>
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
  const int H = model.num_kv_heads, QH = model.num_q_heads, D = msa::kHeadDim, K = model.topk;
  const std::int32_t prompt = 8192, T = 2048, pages = prompt / 128;  // T: tokens per chunk

  // One request; its block table lists the pages in reverse order. Caches start empty (zeros).
  std::vector<std::int32_t> table(pages);
  for (std::int32_t b = 0; b < pages; ++b) table[b] = pages - 1 - b;
  const msa::BlockTable host_table{table.data(), 1, pages, pages};
  const msa::BlockTable device_table{to_device(table), 1, pages, pages};
  msa::KVCacheView cache = msa::make_cache_view(msa::DType::bf16, nullptr, pages, H, msa::Layout::hnd);
  const std::size_t kv_elems = std::size_t(msa::cache_extent(cache));  // [pages, H, 128, 256]
  cache = msa::make_cache_view(msa::DType::bf16, to_device(std::vector<bf16>(kv_elems)), pages, H, msa::Layout::hnd);
  const msa::IndexCacheView index_cache{msa::DType::bf16, to_device(std::vector<bf16>(pages * 128 * D)), pages};
  bf16* q = device_alloc<bf16>(T * QH * D);                    // [T, QH, 128]
  bf16* index_q = device_alloc<bf16>(T * H * D);               // [T, H, 128]
  bf16* k = device_alloc<bf16>(T * H * D);                     // [T, H, 128], V likewise
  bf16* v = device_alloc<bf16>(T * H * D);
  bf16* index_k = device_alloc<bf16>(T * D);                   // [T, 128]
  std::int64_t* slots = device_alloc<std::int64_t>(T);         // [T]
  std::int32_t* topk = device_alloc<std::int32_t>(T * H * K);  // [T, H, topk]
  bf16* out = device_alloc<bf16>(T * QH * D);                  // [T, QH, 128]
  float* lse = device_alloc<float>(T * QH);                    // [T, QH]

  // The step's metadata on the device: query_start and token_request are the same for every chunk.
  auto meta_of = [&](std::int32_t c) { return msa::build_metadata(msa::BatchSpec{{T}, {(c + 1) * T}}); };
  msa::BatchMetadata meta = meta_of(0);
  msa::StepView step = meta.view();
  std::int32_t* seq_lens = to_device(meta.seq_lens);
  step.query_start = to_device(meta.query_start), step.token_request = to_device(meta.token_request);
  step.seq_lens = seq_lens;
  const msa::IndexerArgs index{.index_q = index_q, .num_kv_heads = H, .init_blocks = model.init_blocks,
                               .local_blocks = model.local_blocks, .cache = index_cache,
                               .block_table = device_table, .out = msa::TopkView::token_major(topk, H, K)};
  const msa::AttentionArgs attention{.q = q, .out = out, .lse = lse, .num_q_heads = QH,
                                     .softmax_scale = model.softmax_scale, .topk = index.out,
                                     .cache = cache, .block_table = device_table};

  // Workspaces for the longest need of any chunk: attention plan, block scores, k2q plan.
  const msa::cuda::AttentionShape shape{.num_q_heads = QH, .num_kv_heads = H, .topk = K,
                                        .prefill_order = msa::cuda::PrefillOrder::key_major};
  std::size_t plan_bytes = 0;
  for (std::int32_t c = 0; c < prompt / T; ++c)
    plan_bytes = std::max(plan_bytes, msa::cuda::attention_workspace_bytes(meta_of(c), shape));
  const std::size_t index_bytes = msa::cuda::index_workspace_bytes(T, H, pages);
  const std::size_t k2q_bytes = msa::cuda::k2q_workspace_bytes(T, 1, H, K, pages);
  void *plan_ws = device_alloc<char>(plan_bytes), *index_ws = device_alloc<char>(index_bytes);
  void* k2q_ws = device_alloc<char>(k2q_bytes);
  const msa::cuda::K2QDevicePlan k2q{device_alloc<std::int64_t>(H * pages + 1), device_alloc<std::int32_t>(T * H * K),
                                     device_alloc<std::int32_t>(T * H * K), device_alloc<std::int32_t>(T * H)};

  std::vector<bf16> q_host;
  for (std::int32_t c = 0; c < prompt / T; ++c) {  // chunk c: positions [c * T, (c + 1) * T)
    meta = meta_of(c);
    upload(seq_lens, meta.seq_lens);
    upload(slots, msa::step_slots(meta, host_table));
    upload(q, q_host = random_bf16(T * QH * D));
    for (bf16* x : {k, v, index_q}) upload(x, random_bf16(T * H * D));
    upload(index_k, random_bf16(T * D));
    // The plan depends on the chunk's lengths: one per step, before its run.
    const msa::cuda::AttentionPlan plan = msa::cuda::plan_attention(meta, shape, plan_ws, plan_bytes, nullptr);
    msa::cuda::insert_kv(cache, {k, v, msa::DType::bf16, slots, T}, nullptr);
    msa::cuda::insert_index(index_cache, {index_k, msa::DType::bf16, slots, T}, nullptr);
    msa::cuda::index(step, index, pages, index_ws, index_bytes, nullptr);
    msa::cuda::attend(plan, step, attention, nullptr);
    const std::int32_t rows = meta.num_blocks(0);  // k2q rows per KV head: the request's blocks
    msa::cuda::build_k2q(step, index.out, H, rows, k2q, k2q_ws, k2q_bytes, nullptr);
    const std::vector<std::int64_t> offsets = download(k2q.offsets, std::size_t(H) * rows + 1);
    std::int64_t busiest = 0;
    for (std::int32_t r = 0; r < H * rows; ++r) busiest = std::max(busiest, offsets[r + 1] - offsets[r]);
    std::printf("chunk %d: positions %d..%d select %lld (token, block) pairs over %d blocks; "
                "the busiest block serves %lld tokens\n", c, c * T, (c + 1) * T - 1,
                static_cast<long long>(offsets.back()), rows, static_cast<long long>(busiest));
  }

  // The last chunk on the CPU engine: copies of the cache, the same top-k and queries.
  std::vector<bf16> kv_host = download(static_cast<bf16*>(cache.k), kv_elems);
  std::vector<std::int32_t> topk_host = download(topk, std::size_t(T) * H * K);
  std::vector<bf16> want(std::size_t(T) * QH * D);
  std::vector<float> want_lse(std::size_t(T) * QH);
  msa::AttentionArgs cpu = attention;
  cpu.q = q_host.data(), cpu.out = want.data(), cpu.lse = want_lse.data(), cpu.block_table = host_table;
  cpu.topk = msa::TopkView::token_major(topk_host.data(), H, K);
  cpu.cache = msa::make_cache_view(msa::DType::bf16, kv_host.data(), pages, H, msa::Layout::hnd);
  msa::cpu::attend(meta.view(), cpu);
  const double out_err = max_error(download(out, want.size()), want);
  const double lse_err = max_error(download(lse, want_lse.size()), want_lse);
  const bool ok = out_err < 1e-2 && lse_err < 1e-3;
  std::printf("last chunk against the CPU engine: max |out error| %.1e, max |lse error| %.1e: %s\n", out_err,
              lse_err, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
} catch (const std::exception& e) {  // msa::Error included
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
