// Blocks widened ahead (widen.cu): an fp8 / nvfp4 prefill step first widens
// each (request, block, KV head) that some token selected into the
// workspace, once, as the MMA type (bf16 / fp16), and its token tiles then run
// on the persistent bf16 / fp16 wgmma kernel over those pages. Without it every
// tile widens every block of its union itself (a block in a 16K-token chunk
// is read by hundreds of tiles), and its CTAs take one tile each. Measured on
// the H200 (bench/RESULTS.md in git history): fp8 and nvfp4 prefill steps
// 1.20-1.53x faster; the widening itself (read 32 KiB, write 64 KiB per
// (request, block, KV head)) takes 8-22% of a step. fp8 with per-(token,
// head) scales widens its codes the same way and copies the block's scales
// beside them; the tiles apply those to fp32 scores and probabilities. A
// key-major step (heuristics.hpp) runs the key-major kernel over the widened
// pages too, when they hold every selected block and carry no scales.
//
// Pure host functions with no CUDA includes: the schedule (schedule.hpp)
// sizes the region and lays it out, and the CPU unit tests check both.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "msa/cuda.hpp"
#include "msa/dtype.hpp"

namespace msa::cuda::attention {

// Bytes of one widened page per KV head: the K and V tiles of one (block,
// KV head), 128 keys x 128 dims of a 16-bit type each. A page holds every
// KV head of one (request, block), laid out as a bf16 / fp16 cache
// [page][head][128][128], so that the token tiles read it through the same
// block-table lookup and tensor maps as a cache of their MMA type.
inline constexpr std::int64_t kWidenHeadBytes = 2 * 128 * 128 * 2;
// Bytes of one page's per-token scales per KV head (fp8 with per-(token,
// head) scales): float [2 (K, V)][128 keys].
inline constexpr std::int64_t kWidenScaleBytes = 2 * 128 * 4;

// Whether widened pages carry per-token scales: fp8 caches with per-(token,
// head) scales (nvfp4 has none).
inline bool widen_scales(DType kv, bool token_scales) { return token_scales && is_fp8(kv); }

// Bytes of one widened page per KV head, with its scales when it has them.
inline std::int64_t widen_head_bytes(bool scales) { return kWidenHeadBytes + (scales ? kWidenScaleBytes : 0); }
// The region's default size limit (AttentionTuning::widen_bytes = -1).
inline constexpr std::int64_t kDefaultWidenBytes = std::int64_t(1) << 30;

// How a step widens: pages = 0 when it does not.
struct WidenChoice {
  std::int64_t pages = 0;  // widened (request, block) pages the region holds
  // The step's selections may need more pages than that: the device counts
  // them and runs the on-the-fly kernel instead when they do not fit.
  bool gated = false;
  std::int32_t first_request = 0;  // the step's first prefill request (num_decodes)
  std::int32_t requests = 0;       // its prefill requests
  std::int32_t block_cap = 0;      // blocks of its longest prefill request
  bool scales = false;             // the pages carry per-token scales (fp8 per-(token, head) scales)
};

// Whether a cache's blocks widen ahead exactly: fp8 codes and nvfp4 code x
// group-scale products are bf16 / fp16 values, and per-tensor or global
// scales stay in the kernel's fp32 score and output scales. Per-(token, head)
// fp8 scales are not folded in (each key's product with its scale would be
// rounded: measured, lse off by 3.8e-3-4.4e-3 against the float64 oracle,
// beyond the contract's 1e-3); the pages carry them beside the codes, and the
// tiles apply them to fp32 scores and probabilities (WidenChoice::scales).
inline bool widens_exactly(DType kv) { return kv == DType::nvfp4 || is_fp8(kv); }

// The choice for a step whose prefill rows run as wgmma token tiles
// (`tiles`) on a cache of dtype kv (token_scales: fp8 with per-(token, head)
// scales): caches that widen exactly do unless widen_bytes is 0 (-1:
// kDefaultWidenBytes). The bound on the pages: per prefill request r,
// min(blocks_r, query_len_r x topk x num_kv_heads) distinct selected blocks.
//   query_lens, blocks: [requests] of the prefill requests, from first_request on
inline WidenChoice choose_widen(DType kv, bool token_scales, bool tiles, std::int64_t widen_bytes, int num_kv_heads,
                                int topk, std::int32_t first_request, const std::vector<std::int32_t>& query_lens,
                                const std::vector<std::int32_t>& blocks) {
  WidenChoice c;
  if (!tiles || widen_bytes == 0 || num_kv_heads <= 0 || !widens_exactly(kv)) return c;
  const bool scales = widen_scales(kv, token_scales);
  std::int64_t bound = 0;
  std::int32_t cap = 0;
  for (std::size_t r = 0; r < query_lens.size() && r < blocks.size(); ++r) {
    if (query_lens[r] <= 0 || blocks[r] <= 0) continue;
    bound += std::min<std::int64_t>(blocks[r], std::int64_t(query_lens[r]) * topk * num_kv_heads);
    cap = std::max(cap, blocks[r]);
  }
  const std::int64_t limit =
      (widen_bytes < 0 ? kDefaultWidenBytes : widen_bytes) / (widen_head_bytes(scales) * num_kv_heads);
  c.pages = std::min(bound, limit);
  if (c.pages <= 0) return WidenChoice{};
  c.gated = bound > c.pages;
  c.first_request = first_request;
  c.requests = std::int32_t(query_lens.size());
  c.block_cap = cap;
  c.scales = scales;
  return c;
}

// A schedule's choice (AttentionSchedule::widen_*).
inline WidenChoice schedule_widen_choice(const AttentionSchedule& s) {
  WidenChoice c;
  c.pages = s.widen_pages;
  c.gated = s.widen_gated;
  c.first_request = s.widen_first_request;
  c.requests = s.widen_requests;
  c.block_cap = s.widen_block_cap;
  c.scales = s.widen_scales;
  return c;
}

}  // namespace msa::cuda::attention
