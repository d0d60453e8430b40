// How well a low-precision index (fp8 or nvfp4 index cache) agrees with the
// bf16 index on the same step: the fraction of the blocks the bf16 index
// selects that the low-precision one keeps.
//
// Counted over the (token, KV head) rows that have a choice (more eligible
// blocks than the top-k) and over the blocks that are not forced (init and
// local blocks are in both selections by rule, so they would only inflate the
// figure). Padding rows and rows that select every eligible block do not count.
// Header-only, so that the unit tests check it on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "msa/batch.hpp"
#include "msa/config.hpp"
#include "msa/error.hpp"
#include "msa/select.hpp"

namespace msa::tool {

struct IndexAgreement {
  bool measured = false;              // a low-precision index was compared with the bf16 one
  std::int64_t rows = 0;              // rows with a choice
  std::int64_t reference_blocks = 0;  // non-forced blocks the bf16 index selected in them
  std::int64_t kept = 0;              // of those, also selected by the low-precision index
  std::int64_t identical_rows = 0;    // rows whose selections are the same
  double fraction() const { return reference_blocks ? double(kept) / double(reference_blocks) : 1.0; }
};

// Compares the selections `topk` with the bf16 index's `reference`.
//   topk, reference: [num_tokens, num_kv_heads, model.topk], token-major
inline IndexAgreement index_agreement(const BatchMetadata& meta, const ModelConfig& model,
                                      const std::vector<std::int32_t>& topk,
                                      const std::vector<std::int32_t>& reference) {
  const std::int64_t H = model.num_kv_heads, K = model.topk;
  const std::size_t size = std::size_t(meta.num_tokens * H * K);
  MSA_CHECK(topk.size() == size && reference.size() == size, "index agreement: top-k sizes ",
            topk.size(), " and ", reference.size(), " but the step needs ", size);
  IndexAgreement a;
  a.measured = true;
  for (std::int64_t t = 0; t < meta.num_tokens; ++t) {
    const std::int32_t p = meta.token_position[std::size_t(t)];
    if (p < 0 || p / kBlockSize + 1 <= K) continue;  // padding, or every block selected
    const std::int32_t last = p / kBlockSize;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int32_t* got = topk.data() + (t * H + h) * K;
      const std::int32_t* want = reference.data() + (t * H + h) * K;
      ++a.rows;
      a.identical_rows += std::equal(got, got + K, want);
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int32_t b = want[k];
        if (b < 0 || select::is_forced(b, last, model.init_blocks, model.local_blocks)) continue;
        ++a.reference_blocks;
        a.kept += std::find(got, got + K, b) != got + K;
      }
    }
  }
  return a;
}

}  // namespace msa::tool
