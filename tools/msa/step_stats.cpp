#include "step_stats.hpp"

#include <algorithm>
#include <vector>

namespace msa::tool {

StepStats step_stats(const Workload& w) {
  const BatchMetadata& meta = w.meta();
  const ModelConfig& m = w.model();
  const int H = m.num_kv_heads;
  StepStats s;
  for (std::int32_t r = 0; r < meta.num_requests; ++r) {
    RequestStats q;
    q.request = r;
    q.decode = r < meta.num_decodes;
    q.query_len = meta.query_start[r + 1] - meta.query_start[r];
    q.context_len = meta.context_lens[r];
    q.seq_len = meta.seq_lens[r];
    q.blocks = meta.num_blocks(r);
    std::int64_t valid = 0;
    double distinct = 0.0;
    for (int h = 0; h < H; ++h) {
      std::vector<char> seen(std::size_t(q.blocks), 0);
      for (std::int32_t t = meta.query_start[r]; t < meta.query_start[r + 1]; ++t) {
        const std::int64_t p = meta.token_position[t];
        if (p < 0) continue;
        q.index_keys_scored += p + 1;
        const std::int32_t* row =
            w.topk.data() + (std::int64_t(t) * H + h) * m.topk;  // token-major
        for (int k = 0; k < m.topk; ++k) {
          const std::int64_t b = row[k];
          if (b < 0 || b >= q.blocks) continue;
          ++valid;
          seen[b] = 1;
          const std::int64_t keys = std::clamp<std::int64_t>(p + 1 - b * kBlockSize, 0, kBlockSize);
          q.keys_attended += keys * m.group();
        }
      }
      distinct += double(std::count(seen.begin(), seen.end(), 1));
    }
    const std::int64_t rows = std::int64_t(q.query_len) * H;
    q.selected_per_row = rows ? double(valid) / double(rows) : 0.0;
    q.distinct_blocks = distinct / H;
    s.keys_attended += q.keys_attended;
    s.index_keys_scored += q.index_keys_scored;
    s.requests.push_back(q);
  }
  return s;
}

}  // namespace msa::tool
