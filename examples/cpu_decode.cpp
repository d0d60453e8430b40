// One decode step of one sparse layer on the CPU engine. Two requests, with 300
// and 3,000 tokens already in the paged caches, each decode one new token:
//   insert  the new K, V and index key of each token into its cache slot;
//   index   score the blocks of 128 tokens each token may see, keep the top 16;
//   attend  every query head attends to the keys of its KV head's blocks.
// Request 0 has 3 blocks, fewer than 16, so all are selected and its output is
// plain causal attention: the example checks that with a direct sum.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/config.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "msa/ops.hpp"
#include "msa/slots.hpp"

namespace {

using bf16 = std::uint16_t;  // bf16 bits; msa::num converts them

// n unit-normal values rounded to bf16, standing in for a model's projections.
std::vector<bf16> random_bf16(std::size_t n) {
  static std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<bf16> v(n);
  for (bf16& x : v) x = msa::num::float_to_bf16(normal(rng));
  return v;
}

}  // namespace

int main() try {
  const msa::ModelConfig model = msa::ModelConfig::minimax_m3(4);  // TP4 rank: 16 query heads, 1 KV head
  const int H = model.num_kv_heads, QH = model.num_q_heads, D = msa::kHeadDim;
  const std::vector<std::int32_t> context = {300, 3000};

  // Caches of 32 pages (128 tokens each). A request's block-table row lists its
  // pages in any order; here the index cache uses the same table.
  const std::int64_t pages = 32;
  const std::int32_t max_blocks = 24;
  std::vector<std::int32_t> table(2 * max_blocks, -1);                       // [2, max_blocks]
  for (int b = 0; b < max_blocks; ++b) table[max_blocks + b] = 31 - b;       // request 1: 24 blocks
  table[0] = 3, table[1] = 0, table[2] = 5;                                  // request 0: 3 blocks
  const msa::BlockTable block_table{table.data(), 2, max_blocks, max_blocks};
  msa::KVCacheView cache = msa::make_cache_view(msa::DType::bf16, nullptr, pages, H, msa::Layout::hnd);
  std::vector<bf16> kv_memory(std::size_t(msa::cache_extent(cache)));  // [pages, H, 128, 256]
  cache = msa::make_cache_view(msa::DType::bf16, kv_memory.data(), pages, H, msa::Layout::hnd);
  std::vector<bf16> index_memory(std::size_t(pages) * msa::kBlockSize * D);  // [pages, 128, 128]
  const msa::IndexCacheView index_cache{msa::DType::bf16, index_memory.data(), pages};

  // Writes the K [T, H, 128], V [T, H, 128] and index keys [T, 128] of a step's tokens.
  auto insert = [&](const msa::BatchMetadata& meta) {
    const std::size_t T = std::size_t(meta.num_tokens);
    const std::vector<bf16> k = random_bf16(T * H * D), v = random_bf16(T * H * D), ik = random_bf16(T * D);
    const std::vector<std::int64_t> slots = msa::step_slots(meta, block_table);  // [T]
    msa::cpu::insert_kv(cache, {k.data(), v.data(), msa::DType::bf16, slots.data(), meta.num_tokens});
    msa::cpu::insert_index(index_cache, {ik.data(), msa::DType::bf16, slots.data(), meta.num_tokens});
  };

  // 1. The cached context, as the requests' earlier prefill steps left it.
  insert(msa::build_metadata(msa::BatchSpec{context, context}));

  // 2. The decode step: one new token per request; seq_len counts it.
  const msa::BatchSpec spec{{1, 1}, {context[0] + 1, context[1] + 1}};
  const msa::BatchMetadata meta = msa::build_metadata(spec);
  const std::size_t T = std::size_t(meta.num_tokens);
  insert(meta);
  const std::vector<bf16> q = random_bf16(T * QH * D), index_q = random_bf16(T * H * D);
  std::vector<std::int32_t> topk(T * H * model.topk);  // [T, H, topk] logical block ids, -1 padded
  std::vector<bf16> out(T * QH * D);                    // [T, QH, 128]
  std::vector<float> lse(T * QH);                       // [T, QH]

  const msa::IndexerArgs index{.index_q = index_q.data(), .num_kv_heads = H,
                               .init_blocks = model.init_blocks, .local_blocks = model.local_blocks,
                               .cache = index_cache, .block_table = block_table,
                               .out = msa::TopkView::token_major(topk.data(), H, model.topk)};
  msa::cpu::index(meta.view(), index);
  const msa::AttentionArgs attention{.q = q.data(), .out = out.data(), .lse = lse.data(), .num_q_heads = QH,
                                     .softmax_scale = model.softmax_scale, .topk = index.out,
                                     .cache = cache, .block_table = block_table};
  msa::cpu::attend(meta.view(), attention);

  for (std::size_t t = 0; t < T; ++t) {  // token t is request t's new token
    std::printf("request %zu, seq_len %d, lse of head 0 %.4f, blocks:", t, meta.seq_lens[t], lse[t * QH]);
    for (int k = 0; k < model.topk; ++k) std::printf(" %d", topk[t * model.topk + k]);
    std::printf("\n");
  }

  // 3. Request 0 (token 0) against causal attention over its 301 keys, read from the cache.
  double out_err = 0, lse_err = 0;
  const bf16* kc = static_cast<const bf16*>(cache.k);
  const bf16* vc = static_cast<const bf16*>(cache.v);
  for (int h = 0; h < QH; ++h) {
    std::vector<double> logit(std::size_t(meta.seq_lens[0])), o(D, 0.0);
    auto at = [&](std::int32_t j) { return cache.offset(table[j / 128], 0, j % 128, 0); };
    for (std::int32_t j = 0; j < meta.seq_lens[0]; ++j) {
      for (int d = 0; d < D; ++d)
        logit[j] += double(msa::num::bf16_to_float(q[h * D + d])) * msa::num::bf16_to_float(kc[at(j) + d]);
      logit[j] *= model.softmax_scale;
    }
    const double m = *std::max_element(logit.begin(), logit.end());
    double sum = 0;
    for (std::int32_t j = 0; j < meta.seq_lens[0]; ++j) {
      const double p = std::exp(logit[j] - m);
      sum += p;
      for (int d = 0; d < D; ++d) o[d] += p * msa::num::bf16_to_float(vc[at(j) + d]);
    }
    for (int d = 0; d < D; ++d)
      out_err = std::max(out_err, std::fabs(o[d] / sum - msa::num::bf16_to_float(out[h * D + d])));
    lse_err = std::max(lse_err, std::fabs(m + std::log(sum) - lse[h]));
  }
  const bool ok = out_err < 1e-2 && lse_err < 1e-3;
  std::printf("request 0 against dense causal attention: max |out error| %.1e, max |lse error| %.1e: %s\n",
              out_err, lse_err, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
} catch (const msa::Error& e) {
  std::fprintf(stderr, "msa error: %s\n", e.what());
  return 1;
}
