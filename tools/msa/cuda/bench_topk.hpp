// Synthetic top-k lists and page maps for `msa bench` (pure host functions).
//
// Top-k rows follow the contract's rules (the query's own block always, the
// other ids distinct and eligible, ascending, then -1) so the kernels see
// what the indexer would give them:
//  - random:    the non-local ids are uniform over the eligible blocks;
//  - clustered: they come in runs of 4 neighbouring blocks.
//  - partial:   prefill only, between the two: round(shared x (topk - 1)) of
//               a token's other ids come from its request's clustered set, the
//               rest are uniform (shared 0: random, 1: clustered).
// The rows of one decode / verify request share a base set per KV head (each
// id replaced with probability 1/4 per row), as neighbouring tokens do; partial
// decode rows are random ones. Random prefill tokens draw independently;
// clustered prefill tokens share a set that drifts by one id with probability
// 1/8 per token.
//
// Page map: a copy of the inputs maps, per request, every block some row of
// the request selects (any KV head) to its own fresh physical page; blocks
// nobody selects point at the copy's first page (attention never reads them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "msa/common.hpp"
#include "rng.hpp"

namespace msa::tool {

enum class TopkPattern : std::uint8_t { random, clustered, partial };

inline const char* pattern_name(TopkPattern p) {
  static constexpr const char* kNames[] = {"random", "clustered", "partial"};
  return kNames[int(p)];
}

namespace detail {

inline bool contains(const std::vector<std::int32_t>& v, std::int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Adds a random id from [0, last) that `row` lacks (the lowest missing one
// if sampling keeps missing).
inline void add_random_id(Rng& rng, std::vector<std::int32_t>& row, std::int32_t last) {
  if (last <= 0) return;
  for (int attempt = 0; attempt < 32; ++attempt) {
    const auto b = std::int32_t(rng.between(0, last - 1));
    if (!contains(row, b)) {
      row.push_back(b);
      return;
    }
  }
  for (std::int32_t b = 0; b < last; ++b) {
    if (!contains(row, b)) {
      row.push_back(b);
      return;
    }
  }
}

// `count` distinct ids from [0, last) in the given pattern.
inline std::vector<std::int32_t> draw_ids(Rng& rng, std::int32_t last, std::int32_t count,
                                          TopkPattern pattern) {
  if (pattern == TopkPattern::random) return sample_distinct(rng, last, count);
  std::vector<std::int32_t> ids;
  while (std::int32_t(ids.size()) < count) {
    const auto start = std::int32_t(rng.between(0, last - 1));
    for (std::int32_t b = start; b < std::min(start + 4, last) && std::int32_t(ids.size()) < count; ++b)
      if (!contains(ids, b)) ids.push_back(b);
    if (std::int32_t(ids.size()) < count && rng.chance(0.1)) add_random_id(rng, ids, last);
  }
  return ids;
}

}  // namespace detail

// Top-k lists of every token: [num_tokens, num_kv_heads, topk] token-major.
// shared: the partial pattern's fraction of shared ids (0..1).
//   query_start: [num_requests + 1], seq_lens: [num_requests]
inline std::vector<std::int32_t> make_bench_topk(const std::vector<std::int32_t>& query_start,
                                                 const std::vector<std::int32_t>& seq_lens,
                                                 int num_kv_heads, int topk, bool prefill,
                                                 TopkPattern pattern, std::uint64_t seed, double shared = 0.5) {
  // Partial prefill rows share a clustered set; partial decode rows are random.
  const bool drifts = prefill && pattern != TopkPattern::random;
  const TopkPattern draw = pattern == TopkPattern::partial ? (prefill ? TopkPattern::clustered : TopkPattern::random)
                                                          : pattern;
  const std::int64_t num_tokens = query_start.empty() ? 0 : query_start.back();
  std::vector<std::int32_t> out(std::size_t(num_tokens * num_kv_heads * topk), -1);
  Rng rng(seed);
  std::vector<std::int32_t> row;
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    if (seq_lens[r] <= 0 || qlen <= 0) continue;
    const std::int32_t first_last = (seq_lens[r] - qlen) / kBlockSize;
    for (int h = 0; h < num_kv_heads; ++h) {
      const std::vector<std::int32_t> base =
          detail::draw_ids(rng, first_last, std::min(topk - 1, first_last), draw);
      // Clustered prefill: consecutive tokens share a slowly drifting set (one
      // id replaced with probability 1/8 per token), as a real indexer's are.
      std::vector<std::int32_t> drift = base;
      for (std::int32_t i = 0; i < qlen; ++i) {
        const std::int32_t p = seq_lens[r] - qlen + i;
        const std::int32_t last = p / kBlockSize;
        const std::int32_t valid = std::min(topk, last + 1);
        row.assign(1, last);
        if (drifts) {
          if (!drift.empty() && rng.chance(0.125)) {
            const auto k = std::size_t(rng.between(0, std::int64_t(drift.size()) - 1));
            const auto id = std::int32_t(rng.between(0, last));
            if (!detail::contains(drift, id)) drift[k] = id;
          }
          // The set's first ids; the rest uniform below.
          const std::int32_t from_set =
              pattern == TopkPattern::partial ? 1 + std::int32_t(std::lround(shared * double(valid - 1))) : valid;
          for (const std::int32_t b : drift) {
            if (std::int32_t(row.size()) >= from_set) break;
            if (!detail::contains(row, b)) row.push_back(b);
          }
        } else if (prefill) {
          for (const std::int32_t b : detail::draw_ids(rng, last, valid - 1, pattern)) row.push_back(b);
        } else {
          for (const std::int32_t b : base) {
            if (std::int32_t(row.size()) >= valid) break;
            if (rng.chance(0.25) || detail::contains(row, b)) detail::add_random_id(rng, row, last);
            else row.push_back(b);
          }
        }
        while (std::int32_t(row.size()) < valid) detail::add_random_id(rng, row, last);
        std::sort(row.begin(), row.end());
        std::copy(row.begin(), row.end(), out.begin() + (std::int64_t(q0 + i) * num_kv_heads + h) * topk);
      }
    }
  }
  return out;
}

// One copy's page map: the block table [num_requests, max_blocks] and the
// number of pages it uses, numbered from `first_page`.
struct PageMap {
  std::vector<std::int32_t> table;
  std::int32_t max_blocks = 0;
  std::int64_t pages = 0;
};

// `all_blocks`: map every block to its own page (the index cache); otherwise
// only the blocks that the top-k lists select.
//   topk: [num_tokens, num_kv_heads, topk] (ignored when all_blocks)
inline PageMap map_pages(const std::vector<std::int32_t>& query_start,
                         const std::vector<std::int32_t>& seq_lens,
                         const std::vector<std::int32_t>& topk_ids, int num_kv_heads, int topk,
                         bool all_blocks, std::int64_t first_page) {
  PageMap m;
  const std::size_t n = seq_lens.size();
  for (std::size_t r = 0; r < n; ++r)
    m.max_blocks = std::max(m.max_blocks, (std::max(seq_lens[r], 0) + kBlockSize - 1) / kBlockSize);
  m.max_blocks = std::max(m.max_blocks, 1);
  m.table.assign(n * std::size_t(m.max_blocks), std::int32_t(first_page));
  m.pages = 1;  // page first_page: the target of unselected blocks
  std::vector<std::uint8_t> used;
  for (std::size_t r = 0; r < n; ++r) {
    const std::int32_t blocks = (std::max(seq_lens[r], 0) + kBlockSize - 1) / kBlockSize;
    used.assign(std::size_t(blocks), all_blocks ? 1 : 0);
    if (!all_blocks) {
      const std::int64_t t0 = query_start[r], t1 = query_start[r + 1];
      for (std::int64_t i = t0 * num_kv_heads * topk; i < t1 * num_kv_heads * topk; ++i) {
        const std::int32_t b = topk_ids[std::size_t(i)];
        if (b >= 0 && b < blocks) used[std::size_t(b)] = 1;
      }
    }
    for (std::int32_t b = 0; b < blocks; ++b) {
      if (!used[std::size_t(b)]) continue;
      m.table[r * std::size_t(m.max_blocks) + std::size_t(b)] = std::int32_t(first_page + m.pages);
      ++m.pages;
    }
  }
  return m;
}

// The cache slot (page * 128 + offset) of every new token of the step under a
// page map: the page of its block in its request's row; -1 for padding rows.
//   query_start: [num_requests + 1], seq_lens: [num_requests]; returns [num_tokens]
inline std::vector<std::int64_t> step_slots(const std::vector<std::int32_t>& query_start,
                                            const std::vector<std::int32_t>& seq_lens, const PageMap& map) {
  std::vector<std::int64_t> out(std::size_t(query_start.empty() ? 0 : query_start.back()), -1);
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    if (seq_lens[r] <= 0) continue;
    for (std::int32_t i = 0; i < qlen; ++i) {
      const std::int32_t p = seq_lens[r] - qlen + i;
      const std::int32_t page = map.table[r * std::size_t(map.max_blocks) + std::size_t(p / kBlockSize)];
      out[std::size_t(q0 + i)] = std::int64_t(page) * kBlockSize + p % kBlockSize;
    }
  }
  return out;
}

}  // namespace msa::tool
