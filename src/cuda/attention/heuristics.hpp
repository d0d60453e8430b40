// Host heuristics of the CUDA sparse attention: how many ways the selected
// blocks of one (token, KV head) row are split across CTAs, and how the plan's
// workspace is laid out. Pure functions with no CUDA includes, so the CPU unit
// tests (tests/unit/test_attention_plan.cpp) check them directly.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace msa::cuda::attention {

// Largest split-K factor. Partial results are [rows, heads, splits, 128] fp32.
inline constexpr int kMaxSplits = 16;
// CTAs of the attention kernel that fit on one SM (its shared memory holds two
// 64 KiB K/V stages, so one).
inline constexpr int kCtasPerSm = 1;
// Fixed cost of one CTA (top-k scan, query load, warp merge, epilogue),
// measured in "blocks" (the time one 128-key K/V block takes).
inline constexpr double kCtaOverheadBlocks = 0.5;
// Extra cost of a CTA that writes fp32 partials and needs the combine pass.
inline constexpr double kSplitOverheadBlocks = 0.25;

// Split-K factor for `rows` (token, KV head) rows that each read up to `topk`
// blocks, on `num_sms` SMs. Minimises (waves of CTAs) x (blocks per CTA + the
// per-CTA overheads); ties go to fewer splits. Decode at small batch gets many
// splits (batch 1, one KV head: 16), large prefill gets 1.
inline int choose_splits(std::int64_t rows, int topk, int num_sms, int ctas_per_sm = kCtasPerSm) {
  if (rows <= 0 || topk <= 1 || num_sms <= 0) return 1;
  const std::int64_t slots = std::int64_t(num_sms) * std::max(ctas_per_sm, 1);
  const int max_splits = std::min(topk, kMaxSplits);
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= max_splits; ++s) {
    const std::int64_t waves = (rows * s + slots - 1) / slots;
    const int blocks = (topk + s - 1) / s;
    const double per_cta = blocks + kCtaOverheadBlocks + (s > 1 ? kSplitOverheadBlocks : 0.0);
    const double cost = double(waves) * per_cta;
    if (s == 1 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

struct Splits {
  int decode = 1;   // for tokens [0, num_decode_tokens)
  int prefill = 1;  // for tokens [num_decode_tokens, num_tokens)
  int max() const { return std::max(decode, prefill); }
};

// Split factors of a step: decode and prefill rows are judged apart (they run
// in one launch, decode CTAs first, but each class has its own factor).
inline Splits choose_step_splits(std::int64_t num_tokens, std::int64_t num_decode_tokens,
                                 int num_kv_heads, int topk, int num_sms) {
  Splits s;
  const std::int64_t prefill_tokens = num_tokens - num_decode_tokens;
  if (num_decode_tokens > 0) s.decode = choose_splits(num_decode_tokens * num_kv_heads, topk, num_sms);
  if (prefill_tokens > 0) s.prefill = choose_splits(prefill_tokens * num_kv_heads, topk, num_sms);
  return s;
}

// Where the fp32 partials live in the workspace. Only rows of a class with
// more than one split write partials; tokens are indexed from 0, so when only
// decode rows split the arrays cover num_decode_tokens tokens.
//   partial_out: [partial_tokens, num_q_heads, max_splits, 128] fp32 at out_offset
//   partial_lse: [partial_tokens, num_q_heads, max_splits] fp32 at lse_offset
//   counters:    [partial_tokens, num_kv_heads] int32 at counter_offset: splits
//                of a row that have finished; the last one merges the row and
//                sets the counter back to 0 (plan_attention zeroes them once)
struct WorkspaceLayout {
  std::int64_t partial_tokens = 0;
  int max_splits = 1;
  std::size_t out_offset = 0;
  std::size_t lse_offset = 0;
  std::size_t counter_offset = 0;
  std::size_t counter_bytes = 0;
  std::size_t bytes = 0;  // 0 when nothing splits
};

inline constexpr std::size_t kWorkspaceAlign = 256;
inline std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

inline WorkspaceLayout workspace_layout(std::int64_t num_tokens, std::int64_t num_decode_tokens,
                                        int num_q_heads, int num_kv_heads, const Splits& splits) {
  WorkspaceLayout w;
  w.max_splits = splits.max();
  if (w.max_splits <= 1) return w;
  w.partial_tokens = splits.prefill > 1 ? num_tokens : num_decode_tokens;
  const std::size_t entries =
      std::size_t(w.partial_tokens) * std::size_t(num_q_heads) * std::size_t(w.max_splits);
  w.out_offset = 0;
  w.lse_offset = align_up(entries * 128 * sizeof(float), kWorkspaceAlign);
  w.counter_offset = align_up(w.lse_offset + entries * sizeof(float), kWorkspaceAlign);
  w.counter_bytes = std::size_t(w.partial_tokens) * std::size_t(num_kv_heads) * sizeof(std::int32_t);
  w.bytes = align_up(w.counter_offset + w.counter_bytes, kWorkspaceAlign);
  return w;
}

}  // namespace msa::cuda::attention
