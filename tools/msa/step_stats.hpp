// What one step did, counted from its metadata and top-k lists: blocks selected
// per request, distinct blocks, keys attended, index tokens scored.
#pragma once

#include <cstdint>
#include <vector>

#include "workload.hpp"

namespace msa::tool {

struct RequestStats {
  std::int32_t request = 0;
  bool decode = false;
  std::int32_t query_len = 0;
  std::int32_t context_len = 0;
  std::int32_t seq_len = 0;
  std::int32_t blocks = 0;         // ceil(seq_len / 128): eligible blocks of the last token
  double selected_per_row = 0.0;   // mean valid top-k entries per (token, KV head)
  double distinct_blocks = 0.0;    // blocks selected by any of its tokens, mean over KV heads
  std::int64_t keys_attended = 0;  // sum over tokens and query heads of the keys attended
  std::int64_t index_keys_scored =
      0;  // sum over tokens and KV heads of the index keys scored (p + 1)
};

struct StepStats {
  std::vector<RequestStats> requests;
  std::int64_t keys_attended = 0;
  std::int64_t index_keys_scored = 0;
  double attend_flops() const { return 4.0 * 128.0 * double(keys_attended); }     // q.k and p.v
  double index_flops() const { return 2.0 * 128.0 * double(index_keys_scored); }  // iq.ik
};

// Reads w.topk (after the index stage).
StepStats step_stats(const Workload& w);

}  // namespace msa::tool
