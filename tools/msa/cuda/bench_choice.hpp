// The device's prefill-order choice (PrefillOrder::automatic) on a bench
// case's own top-k lists, counted on the host as key_major.cu's
// items_and_rounds counts it over the k2q plan's edges, so that which order a
// step takes, and by what margin, can be read without a GPU (`msa bench --list
// --counts`). Pure host functions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "bench_accounting.hpp"
#include "cuda/attention/host/heuristics.hpp"
#include "msa/batch.hpp"
#include "msa/k2q.hpp"
#include "msa/ops.hpp"

namespace msa::tool {

struct PrefillChoice {
  std::int64_t tile_rounds = 0;  // edges whose token is in another token tile than the edge before's
  std::int64_t items = 0;        // key-major work items: ceil(edges / item tokens) per k2q row
  bool key_major = false;        // what prefer_key_major picks from the two
  bool planned = false;          // automatic builds the plan (and so chooses): >= min_tokens tokens
};

// The counts over a k2q plan's edges (rows in plan order, tokens ascending in
// a row), T = tile_tokens tokens a token tile and item_tokens a work item.
inline PrefillChoice count_prefill_choice(const K2QPlan& plan, int tile_tokens, int item_tokens) {
  PrefillChoice c;
  const std::vector<std::int32_t>& tok = plan.tokens;
  for (std::size_t e = 0; e < tok.size(); ++e)
    c.tile_rounds += e == 0 || tok[e] / tile_tokens != tok[e - 1] / tile_tokens;
  for (std::size_t r = 0; r + 1 < plan.offsets.size(); ++r)
    c.items += (plan.offsets[r + 1] - plan.offsets[r] + item_tokens - 1) / item_tokens;
  c.key_major = cuda::attention::prefer_key_major(c.tile_rounds, c.items, false);
  return c;
}

// The choice on an attend prefill case's first input copy (the top-k lists
// `msa bench` makes for copy 0 with this seed; run_pattern: --pattern).
inline PrefillChoice prefill_choice(const BenchCase& c, std::uint64_t seed, std::optional<TopkPattern> run_pattern,
                                    std::int64_t min_tokens = cuda::attention::kKeyMajorMinTokens) {
  const BatchMetadata m = build_metadata(bench_batch_spec(c));
  std::vector<std::int32_t> topk = case_topk(c, m, case_pattern(c, run_pattern), seed, 0);
  const K2QPlan plan =
      build_k2q(m.view(), TopkView::token_major(topk.data(), c.num_kv_heads, c.topk), c.num_kv_heads);
  const int group = c.num_q_heads / c.num_kv_heads;
  PrefillChoice choice = count_prefill_choice(plan, cuda::attention::tile_tokens(group, c.topk),
                                              cuda::attention::key_major_item_tokens(group));
  choice.planned = m.num_tokens >= min_tokens;
  return choice;
}

}  // namespace msa::tool
