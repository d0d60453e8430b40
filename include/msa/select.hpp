// The selection order of the indexer (contract 5), shared by every backend so
// that all of them pick bit-identical top-k lists from the same scores.
#pragma once

#include <cstdint>

#include "msa/common.hpp"

namespace msa::select {

// True when block a (score sa) ranks before block b (score sb): higher score
// first, NaN lowest of all, ties (and NaN against NaN) to the lower block id.
MSA_HD bool ranks_before(float sa, std::int32_t a, float sb, std::int32_t b) {
  const bool na = sa != sa, nb = sb != sb;
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a < b;
}

// Whether logical block b is forced for a query whose own block is `last`
// (= p / 128): b < init_blocks, or b > last - local_blocks.
MSA_HD bool is_forced(std::int32_t b, std::int32_t last, std::int32_t init_blocks,
                      std::int32_t local_blocks) {
  return b < init_blocks || b > last - local_blocks;
}

// Valid entries of a row: min(topk, last + 1).
MSA_HD std::int32_t num_valid(std::int32_t last, std::int32_t topk) {
  return last + 1 < topk ? last + 1 : topk;
}

}  // namespace msa::select
