#include "msa/context_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "msa/error.hpp"
#include "msa/select.hpp"

namespace msa::cp {
namespace {

bool candidate_before(const Candidate& a, const Candidate& b) {
  return select::ranks_before(a.score, a.block, b.score, b.block);
}

// The selection numbers every per-row rule takes.
void check_row(const char* fn, std::int32_t topk, std::int32_t init_blocks, std::int32_t local_blocks) {
  MSA_CHECK(topk >= 1 && topk <= kMaxTopk, fn, ": topk = ", topk, " is outside [1, ", kMaxTopk, "]");
  MSA_CHECK(init_blocks >= 0 && local_blocks >= 0, fn, ": init_blocks = ", init_blocks,
            ", local_blocks = ", local_blocks, " must not be negative");
  MSA_CHECK(std::int64_t(init_blocks) + local_blocks <= topk, fn, ": init_blocks + local_blocks = ",
            std::int64_t(init_blocks) + local_blocks, " exceeds topk = ", topk);
}

void check_sharding(const char* fn, const Sharding& sharding, std::int32_t rank) {
  MSA_CHECK(sharding.num_ranks >= 1, fn, ": sharding.num_ranks = ", sharding.num_ranks, " must be >= 1");
  MSA_CHECK(rank >= 0 && rank < sharding.num_ranks, fn, ": rank = ", rank, " is not in [0, ",
            sharding.num_ranks, ")");
}

}  // namespace

void local_candidates(const float* scores, std::int32_t last, const Sharding& sharding,
                      std::int32_t rank, std::int32_t topk, std::int32_t init_blocks,
                      std::int32_t local_blocks, Candidate* out) {
  check_sharding("local_candidates", sharding, rank);
  check_row("local_candidates", topk, init_blocks, local_blocks);
  std::vector<Candidate> mine;
  for (std::int32_t b = 0; b <= last; ++b) {
    if (sharding.owner(b) != rank || select::is_forced(b, last, init_blocks, local_blocks)) continue;
    mine.push_back({scores[b], b});
  }
  const std::size_t keep = std::min<std::size_t>(mine.size(), std::size_t(topk));
  std::partial_sort(mine.begin(), mine.begin() + keep, mine.end(), candidate_before);
  for (std::int32_t i = 0; i < topk; ++i)
    out[i] = std::size_t(i) < keep ? mine[i] : Candidate{-std::numeric_limits<float>::infinity(), -1};
}

void candidates_from_topk(const float* scores, const std::int32_t* own_topk, std::int32_t last,
                          const Sharding& sharding, std::int32_t rank, std::int32_t topk,
                          std::int32_t init_blocks, std::int32_t local_blocks, Candidate* out) {
  check_sharding("candidates_from_topk", sharding, rank);
  check_row("candidates_from_topk", topk, init_blocks, local_blocks);
  std::int32_t n = 0;
  for (std::int32_t k = 0; k < topk; ++k) {
    const std::int32_t b = own_topk[k];
    if (b < 0 || b > last || sharding.owner(b) != rank ||
        select::is_forced(b, last, init_blocks, local_blocks))
      continue;
    out[n++] = Candidate{scores[b], b};
  }
  for (; n < topk; ++n) out[n] = Candidate{-std::numeric_limits<float>::infinity(), -1};
}

void merge_candidates(const Candidate* candidates, std::int32_t num_ranks, std::int32_t last,
                      std::int32_t topk, std::int32_t init_blocks, std::int32_t local_blocks,
                      std::int32_t* out) {
  check_row("merge_candidates", topk, init_blocks, local_blocks);
  MSA_CHECK(num_ranks >= 1, "merge_candidates: num_ranks = ", num_ranks, " must be >= 1");
  std::fill(out, out + topk, -1);
  if (last < 0) return;
  const std::int32_t valid = select::num_valid(last, topk);
  std::vector<std::int32_t> chosen;
  for (std::int32_t b = 0; b <= last && std::int32_t(chosen.size()) < valid; ++b)
    if (select::is_forced(b, last, init_blocks, local_blocks)) chosen.push_back(b);
  std::vector<Candidate> pool;
  for (std::int64_t i = 0; i < std::int64_t(num_ranks) * topk; ++i)
    if (candidates[i].block >= 0) pool.push_back(candidates[i]);
  std::sort(pool.begin(), pool.end(), candidate_before);
  for (const Candidate& c : pool) {
    if (std::int32_t(chosen.size()) >= valid) break;
    chosen.push_back(c.block);
  }
  std::sort(chosen.begin(), chosen.end());
  std::copy(chosen.begin(), chosen.end(), out);
}

void owned_entries(const std::int32_t* row, std::int32_t topk, const Sharding& sharding,
                   std::int32_t rank, std::int32_t* out) {
  check_sharding("owned_entries", sharding, rank);
  MSA_CHECK(topk >= 1 && topk <= kMaxTopk, "owned_entries: topk = ", topk, " is outside [1, ", kMaxTopk, "]");
  std::int32_t n = 0;
  for (std::int32_t k = 0; k < topk; ++k)
    if (row[k] >= 0 && sharding.owner(row[k]) == rank) out[n++] = row[k];
  for (; n < topk; ++n) out[n] = -1;
}

void merge_partials(const float* const* outs, const float* const* lses, std::int32_t num_ranks,
                    std::int64_t n, float* out, float* lse) {
  for (std::int64_t i = 0; i < n; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::int32_t r = 0; r < num_ranks; ++r) m = std::max(m, lses[r][i]);
    float* o = out + i * kHeadDim;
    std::fill(o, o + kHeadDim, 0.0f);
    if (m == -std::numeric_limits<float>::infinity()) {
      lse[i] = m;
      continue;
    }
    double total = 0.0;
    for (std::int32_t r = 0; r < num_ranks; ++r) total += std::exp(double(lses[r][i]) - m);
    for (std::int32_t r = 0; r < num_ranks; ++r) {
      const float w = float(std::exp(double(lses[r][i]) - m) / total);
      if (w == 0.0f) continue;
      const float* p = outs[r] + i * kHeadDim;
      for (int d = 0; d < kHeadDim; ++d) o[d] += w * p[d];
    }
    lse[i] = float(m + std::log(total));
  }
}

}  // namespace msa::cp
