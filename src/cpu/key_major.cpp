// Key-major (k2q) sparse attention of the CPU engine: pass 1 over the plan's
// rows writes per-slot partial outputs and lse, pass 2 merges them per token.
#include "msa/key_major.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/checks.hpp"
#include "cpu/attention_blocks.hpp"
#include "cpu/parallel.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float load_query(const AttentionArgs& a, std::int64_t i) {
  switch (a.q_dtype) {
    case DType::bf16: return num::bf16_to_float(static_cast<const std::uint16_t*>(a.q)[i]);
    case DType::fp16: return num::fp16_to_float(static_cast<const std::uint16_t*>(a.q)[i]);
    default: return num::e4m3_to_float(static_cast<const std::uint8_t*>(a.q)[i]) * a.q_scale;
  }
}

// The plan matches the step, the cache and the range, and its edges of each
// (token, head) are exactly the slots [0, counts) once each, all visible.
void check_plan(const StepView& step, const AttentionArgs& args, const K2QPlan& plan,
                std::int32_t begin, std::int32_t end) {
  const int heads = args.cache.num_kv_heads;
  MSA_CHECK(0 <= begin && begin <= end && end <= step.num_tokens, "token range [", begin, ", ",
            end, ") is not inside [0, ", step.num_tokens, ")");
  MSA_CHECK(plan.num_kv_heads == heads, "plan.num_kv_heads = ", plan.num_kv_heads,
            " but the cache has ", heads);
  MSA_CHECK(plan.topk == args.topk.topk, "plan.topk = ", plan.topk, " but topk.topk = ",
            args.topk.topk);
  MSA_CHECK(plan.row_start.size() == std::size_t(step.num_requests) + 1, "plan.row_start has ",
            plan.row_start.size(), " entries but the step has ", step.num_requests, " requests");
  for (std::int32_t r = 0; r < step.num_requests; ++r) {
    const std::int64_t blocks = (std::int64_t(step.seq_lens[r]) + kBlockSize - 1) / kBlockSize;
    MSA_CHECK(plan.row_start[r] <= plan.row_start[r + 1] &&
                  plan.row_start[r + 1] - plan.row_start[r] == blocks,
              "plan.row_start[", r + 1, "] = ", plan.row_start[r + 1], " but request ", r, " has ",
              blocks, " blocks after row ", plan.row_start[r]);
  }
  const std::int64_t rows = plan.num_rows * heads;
  MSA_CHECK(plan.num_rows == plan.row_start.back() && plan.offsets.size() == std::size_t(rows) + 1 &&
                plan.offsets[0] == 0 && plan.tokens.size() == std::size_t(plan.offsets[rows]) &&
                plan.slots.size() == plan.tokens.size(),
            "plan has inconsistent sizes (num_rows ", plan.num_rows, ", ", plan.offsets.size(),
            " offsets, ", plan.tokens.size(), " tokens, ", plan.slots.size(), " slots)");
  MSA_CHECK(plan.counts.size() == std::size_t(step.num_tokens) * heads, "plan.counts has ",
            plan.counts.size(), " entries, want num_tokens * num_kv_heads = ",
            std::int64_t(step.num_tokens) * heads);
  std::vector<std::uint64_t> seen(plan.counts.size(), 0);  // [num_tokens, num_kv_heads] slot bits
  for (std::int64_t row = 0; row < rows; ++row) {
    const auto h = std::int32_t(row / plan.num_rows);
    const std::int64_t local = row - std::int64_t(h) * plan.num_rows;
    const auto r = std::int32_t(std::upper_bound(plan.row_start.begin(), plan.row_start.end(), local) -
                                plan.row_start.begin() - 1);
    const std::int64_t first = (local - plan.row_start[r]) * kBlockSize;
    MSA_CHECK(plan.offsets[row] <= plan.offsets[row + 1], "plan.offsets[", row + 1, "] = ",
              plan.offsets[row + 1], " < plan.offsets[", row, "] = ", plan.offsets[row]);
    for (std::int64_t e = plan.offsets[row]; e < plan.offsets[row + 1]; ++e) {
      const std::int32_t t = plan.tokens[e], k = plan.slots[e];
      MSA_CHECK(t >= begin && t < end && step.token_request[t] == r && step.position(t, r) >= first,
                "plan.tokens[", e, "] = ", t, " in row ", row, " (h ", h, ", request ", r,
                ", block ", first / kBlockSize, ") is not a token of [", begin, ", ", end,
                ") of that request that sees the block");
      const std::size_t th = std::size_t(t) * heads + h;
      MSA_CHECK(k >= 0 && k < plan.topk && k < plan.counts[th] && !(seen[th] >> k & 1), "plan.slots[", e, "] = ", k,
                " of token ", t, ", h ", h, " is repeated or not below its count ", plan.counts[th]);
      seen[th] |= std::uint64_t(1) << k;
    }
  }
  for (std::int32_t t = 0; t < step.num_tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const std::int32_t n = plan.counts[std::size_t(t) * heads + h];
      const bool in = t >= begin && t < end;
      MSA_CHECK(n >= 0 && n <= plan.topk && (in || n == 0), "plan.counts[t=", t, ", h=", h, "] = ",
                n, in ? " is not in [0, topk]" : " but the token is outside the range");
      MSA_CHECK(std::popcount(seen[std::size_t(t) * heads + h]) == n, "plan.counts[t=", t, ", h=",
                h, "] = ", n, " but the plan has ", std::popcount(seen[std::size_t(t) * heads + h]),
                " edges");
    }
  }
}

// Pass 1 for one row: every edge, every query head of the group.
void row_partials(const StepView& step, const AttentionArgs& args, const K2QPlan& plan,
                  std::int64_t row, attn::Block& blk, float* partial_out, float* partial_lse) {
  const int group = args.num_q_heads / plan.num_kv_heads;
  const auto h = std::int32_t(row / plan.num_rows);
  const std::int64_t local = row - std::int64_t(h) * plan.num_rows;
  const auto r = std::int32_t(
      std::upper_bound(plan.row_start.begin(), plan.row_start.end(), local) - plan.row_start.begin() - 1);
  const std::int64_t b = local - plan.row_start[r];
  const std::int64_t first = b * kBlockSize;
  // A page outside the table or the cache (possible only with checks off)
  // holds no keys for the row's edges: their partials are empty.
  const std::int64_t page = b < args.block_table.max_blocks && args.cache.num_pages > 0 ? args.block_table.at(r, b) : -1;
  const bool usable = page >= 0 && page < args.cache.num_pages;
  const auto rows = usable ? std::int32_t(std::min<std::int64_t>(kBlockSize, step.seq_lens[r] - first)) : 0;
  if (usable) attn::load_block(args.cache, page, h, rows, blk);

  alignas(64) float q[kHeadDim], s[kBlockSize], acc[kHeadDim];
  for (std::int64_t e = plan.offsets[row]; e < plan.offsets[row + 1]; ++e) {
    const std::int32_t t = plan.tokens[e], k = plan.slots[e];
    const int n = int(std::clamp<std::int64_t>(step.position(t, r) + 1 - first, 0, rows));
    for (int g = 0; g < group; ++g) {
      const std::int64_t qh = std::int64_t(t) * args.num_q_heads + std::int64_t(h) * group + g;
      for (int d = 0; d < kHeadDim; ++d) q[d] = load_query(args, qh * kHeadDim + d) * args.softmax_scale;
      std::fill(s, s + kBlockSize, 0.0f);
      for (int d = 0; d < kHeadDim; ++d) {
        for (int j = 0; j < kBlockSize; ++j) s[j] += q[d] * blk.kt[d][j];
      }
      float m = kNegInf;
      for (int j = 0; j < n; ++j) m = std::max(m, s[j]);
      float sum = 0.0f;
      std::fill(acc, acc + kHeadDim, 0.0f);
      if (m != kNegInf) {
        for (int j = 0; j < n; ++j) {
          const float pj = std::exp(s[j] - m);
          sum += pj;
          for (int d = 0; d < kHeadDim; ++d) acc[d] += pj * blk.v[j][d];
        }
      }
      const std::int64_t slot = qh * plan.topk + k;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      for (int d = 0; d < kHeadDim; ++d) partial_out[slot * kHeadDim + d] = acc[d] * inv;
      partial_lse[slot] = sum > 0.0f ? m + std::log(sum) : kNegInf;
    }
  }
}

// Pass 2 for one token: lse-weighted merge of its valid slots per query head.
void combine_token(const AttentionArgs& args, const K2QPlan& plan, std::int32_t t,
                   const float* partial_out, const float* partial_lse) {
  const int group = args.num_q_heads / plan.num_kv_heads;
  alignas(64) float acc[kHeadDim];
  for (int qi = 0; qi < args.num_q_heads; ++qi) {
    const std::int64_t qh = std::int64_t(t) * args.num_q_heads + qi;
    const std::int32_t n = plan.counts[std::size_t(t) * plan.num_kv_heads + qi / group];
    const float* lse = partial_lse + qh * plan.topk;            // [topk]
    const float* part = partial_out + qh * plan.topk * kHeadDim;  // [topk, 128]
    float m = kNegInf;
    for (int k = 0; k < n; ++k) m = std::max(m, lse[k]);
    float sum = 0.0f;
    std::fill(acc, acc + kHeadDim, 0.0f);
    if (m != kNegInf) {
      for (int k = 0; k < n; ++k) {
        const float w = std::exp(lse[k] - m);
        if (w == 0.0f) continue;  // an empty slot (0 output, -inf lse)
        sum += w;
        for (int d = 0; d < kHeadDim; ++d) acc[d] += w * part[k * kHeadDim + d];
      }
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    auto* out = static_cast<std::uint16_t*>(args.out) + qh * kHeadDim;  // [128]
    for (int d = 0; d < kHeadDim; ++d) {
      const float x = acc[d] * inv;
      out[d] = args.out_dtype == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
    }
    if (args.lse) args.lse[qh] = sum > 0.0f ? m + std::log(sum) : kNegInf;
  }
}

}  // namespace

std::size_t key_major_partial_floats(std::int32_t num_tokens, std::int32_t num_q_heads,
                                     std::int32_t topk) {
  return std::size_t(num_tokens) * std::size_t(num_q_heads) * std::size_t(topk) * kHeadDim;
}

void attend_key_major(const StepView& step, const AttentionArgs& args, const K2QPlan& plan,
                      float* partial_out, float* partial_lse, const Options& opt,
                      std::int32_t token_begin, std::int32_t token_end) {
  check_options(opt);
  if (token_end < 0) token_end = step.num_tokens;
  check::attention_shape(step, args);
  check::step_data(step);
  if (opt.check) check::block_table_data(step, args.block_table, args.cache.num_pages, "block_table");
  check_plan(step, args, plan, token_begin, token_end);
  MSA_CHECK(plan.tokens.empty() || (partial_out && partial_lse),
            "partial_out / partial_lse is null but the plan has ", plan.tokens.size(), " edges");
  const int threads = resolve_threads(opt.num_threads);
  const std::int64_t rows = plan.num_rows * plan.num_kv_heads;
  parallel_for(rows, threads, 4, [&](std::int64_t begin, std::int64_t end) {
    std::unique_ptr<attn::Block> blk;
    for (std::int64_t row = begin; row < end; ++row) {
      if (plan.offsets[row] == plan.offsets[row + 1]) continue;
      if (!blk) blk = std::make_unique<attn::Block>();
      row_partials(step, args, plan, row, *blk, partial_out, partial_lse);
    }
  });
  parallel_for(token_end - token_begin, threads, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      combine_token(args, plan, std::int32_t(token_begin + i), partial_out, partial_lse);
    }
  });
}

}  // namespace msa::cpu
