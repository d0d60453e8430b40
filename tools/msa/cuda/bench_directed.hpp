// Index keys and queries that make the indexer of a `msa bench` layer case
// select runs of neighbouring blocks, as a model's indexer does (pure host
// functions; the device fill is fill_directed in bench_directed_fill.hpp).
//
// Every request's blocks fall in groups of kRunBlocks neighbours; group g of
// request r has a direction: 128 random signs drawn from the group's id
// r * groups_per_request + g. An index key of a block in group g is
// kKeyNoise * N(0, 1) + kKeyAmp * direction(g), elementwise. An index query row
// (token, KV head) carries a set of kQueryGroups group ids and is
// kQueryNoise * N(0, 1) + kQueryAmp * the sum of their directions. Its dot
// product with a key of one of its groups has a mean of 128 * kKeyAmp * kQueryAmp,
// against a spread of about sqrt(kQueryGroups * 128) for unrelated blocks, so
// the top-k is the blocks of its groups (4 x 4 = 16 blocks for top-k 16, the
// local block included). The sets follow bench_topk.hpp's clustered pattern:
// the rows of a decode / verify request share a base set per KV head (each
// group replaced with probability 1/4 per row); prefill tokens share one set per
// KV head that drifts by one group with probability 1/8 per token. With the
// random pattern the rows have no groups (keys and queries are noise only) and
// the selection is the highest of random scores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench_accounting.hpp"
#include "bench_topk.hpp"
#include "msa/common.hpp"
#include "rng.hpp"

namespace msa::tool {

inline constexpr int kRunBlocks = 4;    // blocks per group
inline constexpr int kQueryGroups = 4;  // groups per query row
inline constexpr float kKeyNoise = 0.5f, kKeyAmp = 1.0f;
inline constexpr float kQueryNoise = 0.5f, kQueryAmp = 1.0f;

// Groups of the longest request: ids r * groups_per_request + g never collide.
inline std::int64_t groups_per_request(const std::vector<std::int32_t>& seq_lens) {
  std::int32_t blocks = 1;
  for (const std::int32_t s : seq_lens) blocks = std::max(blocks, (s + kBlockSize - 1) / kBlockSize);
  return (blocks + kRunBlocks - 1) / kRunBlocks;
}

// The group id of each page of one copy's page map (numbered from the map's
// first page): the group of the (request, block) mapped to it, -1 for the
// shared page of unmapped blocks.
//   table: [num_requests, max_blocks]; returns [map.pages]
inline std::vector<std::int64_t> page_groups(const PageMap& map, std::int64_t first_page, std::int64_t per_request) {
  std::vector<std::int64_t> out(std::size_t(map.pages), -1);
  const std::size_t rows = map.max_blocks > 0 ? map.table.size() / std::size_t(map.max_blocks) : 0;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::int32_t b = 0; b < map.max_blocks; ++b) {
      const std::int64_t page = map.table[r * std::size_t(map.max_blocks) + std::size_t(b)] - first_page;
      if (page > 0 && page < map.pages) out[std::size_t(page)] = std::int64_t(r) * per_request + b / kRunBlocks;
    }
  }
  return out;
}

// The group of each new token's block (the keys the step inserts).
//   query_start: [num_requests + 1], seq_lens: [num_requests]; returns [num_tokens]
inline std::vector<std::int64_t> token_groups(const std::vector<std::int32_t>& query_start,
                                              const std::vector<std::int32_t>& seq_lens, std::int64_t per_request) {
  std::vector<std::int64_t> out(std::size_t(query_start.empty() ? 0 : query_start.back()), -1);
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    for (std::int32_t i = 0; i < qlen; ++i) {
      const std::int32_t p = token_position(seq_lens[r], qlen, i);
      if (p >= 0) out[std::size_t(q0 + i)] = std::int64_t(r) * per_request + p / kBlockSize / kRunBlocks;
    }
  }
  return out;
}

// The group sets of every query row, [num_tokens, num_kv_heads, kQueryGroups]
// (-1: none), as described above; all -1 for the random pattern. Groups are
// drawn among those whose blocks precede the request's new tokens (a prefill
// drift may take any group up to the token's own).
inline std::vector<std::int64_t> query_groups(const std::vector<std::int32_t>& query_start,
                                              const std::vector<std::int32_t>& seq_lens, int num_kv_heads,
                                              bool prefill, TopkPattern pattern, std::int64_t per_request,
                                              std::uint64_t seed) {
  const std::int64_t num_tokens = query_start.empty() ? 0 : query_start.back();
  std::vector<std::int64_t> out(std::size_t(num_tokens * num_kv_heads * kQueryGroups), -1);
  if (pattern == TopkPattern::random) return out;
  Rng rng(seed);
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    if (seq_lens[r] <= 0 || qlen <= 0) continue;
    const std::int32_t first_groups = (seq_lens[r] - qlen) / kBlockSize / kRunBlocks;
    const std::int64_t base_id = std::int64_t(r) * per_request;
    for (int h = 0; h < num_kv_heads; ++h) {
      std::vector<std::int32_t> set = sample_distinct(rng, first_groups, kQueryGroups);
      for (std::int32_t i = 0; i < qlen; ++i) {
        std::vector<std::int32_t> row = set;
        if (prefill) {
          if (!set.empty() && rng.chance(0.125)) {
            const std::int32_t own = token_position(seq_lens[r], qlen, i) / kBlockSize / kRunBlocks;
            const auto g = std::int32_t(rng.between(0, own));
            if (!detail::contains(set, g)) set[std::size_t(rng.between(0, std::int64_t(set.size()) - 1))] = g;
          }
          row = set;
        } else {
          for (std::int32_t& g : row) {
            if (!rng.chance(0.25)) continue;
            const auto other = std::int32_t(rng.between(0, std::max(first_groups - 1, 0)));
            if (!detail::contains(row, other)) g = other;
          }
        }
        std::int64_t* dst = out.data() + (std::int64_t(q0 + i) * num_kv_heads + h) * kQueryGroups;
        for (std::size_t k = 0; k < row.size() && k < std::size_t(kQueryGroups); ++k) dst[k] = base_id + row[k];
      }
    }
  }
  return out;
}

// How far the indexer followed the groups: over every query row with groups,
// the fraction of its selected blocks, other than its own (forced) block, that
// lie in one of its groups. 1 when it selected only its groups' blocks; -1 when
// no row has groups (the random pattern).
//   topk: [num_tokens, num_kv_heads, topk]; groups: [num_tokens, num_kv_heads, kQueryGroups]
inline double group_selection_fraction(const std::vector<std::int32_t>& query_start,
                                       const std::vector<std::int32_t>& seq_lens,
                                       const std::vector<std::int32_t>& topk_ids, int num_kv_heads, int topk,
                                       const std::vector<std::int64_t>& groups, std::int64_t per_request) {
  std::int64_t in = 0, all = 0;
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    for (std::int32_t i = 0; i < qlen; ++i) {
      const std::int32_t p = token_position(seq_lens[r], qlen, i);
      if (p < 0) continue;
      for (int h = 0; h < num_kv_heads; ++h) {
        const std::int64_t row = std::int64_t(q0 + i) * num_kv_heads + h;
        const std::int64_t* g = groups.data() + row * kQueryGroups;
        if (std::all_of(g, g + kQueryGroups, [](std::int64_t x) { return x < 0; })) continue;
        for (int k = 0; k < topk; ++k) {
          const std::int32_t b = topk_ids[std::size_t(row * topk + k)];
          if (b < 0 || b == p / kBlockSize) continue;
          const std::int64_t id = std::int64_t(r) * per_request + b / kRunBlocks;
          ++all;
          in += std::find(g, g + kQueryGroups, id) != g + kQueryGroups ? 1 : 0;
        }
      }
    }
  }
  return all > 0 ? double(in) / double(all) : -1.0;
}

}  // namespace msa::tool
