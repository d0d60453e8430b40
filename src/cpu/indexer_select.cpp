// Top-k selection of one indexer row (contract 5) with the shared ranking rule
// of msa/select.hpp.
//
// With n = last + 1 eligible blocks: if n <= topk every block is selected.
// Otherwise the forced blocks are [0, init_blocks) and [n - local_blocks, n),
// and the others (the candidates between them) compete for the remaining
// topk - init_blocks - local_blocks places. The winners are kept in a bounded
// heap whose top is the worst winner, so each candidate costs one comparison
// unless it beats that worst: O(n + k log k) with no allocation.
#include <algorithm>
#include <cstdint>

#include "msa/common.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/select.hpp"

namespace msa::cpu {

void select_row(const float* scores, std::int32_t last, std::int32_t topk, std::int32_t init_blocks,
                std::int32_t local_blocks, std::int32_t* out) {
  MSA_CHECK(topk >= 1 && topk <= kMaxTopk, "select_row: topk = ", topk, " is outside [1, ",
            kMaxTopk, "]");
  MSA_CHECK(init_blocks >= 0 && local_blocks >= 0, "select_row: init_blocks = ", init_blocks,
            ", local_blocks = ", local_blocks, " must not be negative");
  MSA_CHECK(std::int64_t(init_blocks) + local_blocks <= topk, "select_row: init_blocks + local_blocks = ",
            std::int64_t(init_blocks) + local_blocks, " exceeds topk = ", topk);
  const std::int32_t n = last < 0 ? 0 : last + 1;  // eligible blocks
  if (n <= topk) {
    for (std::int32_t b = 0; b < n; ++b) out[b] = b;
    for (std::int32_t k = n; k < topk; ++k) out[k] = -1;
    return;
  }
  // n > topk >= init + local, so head < tail and both forced ranges are whole.
  const std::int32_t head = init_blocks;        // [0, head) forced
  const std::int32_t tail = n - local_blocks;   // [tail, n) forced
  const std::int32_t pick = topk - init_blocks - local_blocks;

  // Max-heap under "ranks before": the top ranks last among the winners.
  auto before = [scores](std::int32_t a, std::int32_t b) {
    return select::ranks_before(scores[a], a, scores[b], b);
  };
  std::int32_t won[kMaxTopk];
  std::int32_t count = 0;
  if (pick > 0) {
    std::int32_t b = head;
    for (; b < tail && count < pick; ++b) won[count++] = b;
    std::make_heap(won, won + count, before);
    for (; b < tail; ++b) {
      if (!before(b, won[0])) continue;
      std::pop_heap(won, won + count, before);
      won[count - 1] = b;
      std::push_heap(won, won + count, before);
    }
    std::sort(won, won + count);
  }

  std::int32_t k = 0;
  for (std::int32_t b = 0; b < head; ++b) out[k++] = b;
  for (std::int32_t i = 0; i < count; ++i) out[k++] = won[i];
  for (std::int32_t b = tail; b < n; ++b) out[k++] = b;
  for (; k < topk; ++k) out[k] = -1;
}

}  // namespace msa::cpu
