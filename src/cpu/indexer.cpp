// The CPU indexer (contract 5): block scores, then top-k selection per
// (token, KV head).
//
// Scoring works block by block: a run of tokens of one request (a "segment",
// consecutive positions) sees blocks 0 .. p_last / 128. One work item is one
// (segment, block): it decodes the block's 128 index keys to fp32 once
// (transposed, indexer_dots.hpp) and runs every query row of the segment that
// sees the block against them. Rows whose own block it is see only the keys at
// j <= p and go through the masked kernel call; later rows see all 128 keys.
// Items are spread over the threads dynamically. The arithmetic order of a
// score is documented in indexer_dots.hpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "core/checks.hpp"
#include "cpu/indexer_check.hpp"
#include "cpu/indexer_dots.hpp"
#include "cpu/parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu {

namespace {

using indexer::KeyBlock;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Scores scratch of index(), in floats: tokens are scored in chunks that fit.
constexpr std::int64_t kScoreBudget = std::int64_t(1) << 22;

// Tokens [begin, end) of one request with positions first_pos, first_pos + 1, ...
struct Segment {
  std::int32_t request = 0;
  std::int32_t begin = 0;
  std::int32_t end = 0;
  std::int32_t first_pos = 0;
  std::int32_t last_block() const { return (first_pos + (end - begin) - 1) / kBlockSize; }
};

// Splits tokens [begin, end) into segments; padding rows (position < 0) belong
// to none.
std::vector<Segment> find_segments(const StepView& step, std::int32_t begin, std::int32_t end) {
  std::vector<Segment> segments;
  for (std::int32_t t = begin; t < end; ++t) {
    const std::int32_t r = step.token_request[t];
    const std::int32_t p = step.position(t, r);
    if (p < 0) continue;
    if (!segments.empty()) {
      Segment& s = segments.back();
      if (s.request == r && s.end == t && s.first_pos + (t - s.begin) == p) {
        s.end = t + 1;
        continue;
      }
    }
    segments.push_back(Segment{r, t, t + 1, p});
  }
  return segments;
}

// Physical page of request r's block b, or -1 when the table has no such
// column or the page is outside the cache (possible only with checks off).
std::int64_t page_of(const IndexerArgs& args, std::int32_t r, std::int32_t b) {
  if (b >= args.block_table.max_blocks || args.cache.num_pages == 0) return -1;
  const std::int64_t page = args.block_table.at(r, b);
  return page < args.cache.num_pages ? page : -1;
}

// Index queries of tokens [begin, end) as fp32.
//   q: [end - begin, num_kv_heads, 128]
void load_queries(const IndexerArgs& args, std::int32_t begin, std::int32_t end, float* q) {
  const std::int64_t first = std::int64_t(begin) * args.num_kv_heads * kHeadDim;
  const std::int64_t count = std::int64_t(end - begin) * args.num_kv_heads * kHeadDim;
  const auto* src = static_cast<const std::uint16_t*>(args.index_q) + first;
  if (args.iq_dtype == DType::bf16) {
    for (std::int64_t i = 0; i < count; ++i) q[i] = num::bf16_to_float(src[i]);
  } else if (args.iq_dtype == DType::fp16) {
    for (std::int64_t i = 0; i < count; ++i) q[i] = num::fp16_to_float(src[i]);
  } else if (args.iq_dtype == DType::fp8_e4m3) {
    const auto* codes = static_cast<const std::uint8_t*>(args.index_q) + first;
    for (std::int64_t i = 0; i < count; ++i) q[i] = num::e4m3_to_float(codes[i]);
  } else {
    fail("indexer: iq_dtype = ", dtype_name(args.iq_dtype), " but the index query must be bf16, fp16 or fp8_e4m3");
  }
}

// Scores of tokens [begin, end): row (t - begin) * num_kv_heads + h of
// `scores` gets columns 0 .. p / 128 computed and -inf after, up to `stride`;
// padding rows get -inf everywhere.
//   scores: [end - begin, num_kv_heads, stride]
void score_tokens(const StepView& step, const IndexerArgs& args, std::int32_t begin, std::int32_t end,
                  float* scores, std::int64_t stride, int threads) {
  const std::int64_t heads = args.num_kv_heads;
  const std::int64_t row_len = heads * kHeadDim;
  std::vector<float> q(std::size_t(end - begin) * std::size_t(row_len));  // [end - begin, heads, 128]

  // Queries to fp32, and -inf where no block will write.
  parallel_for(end - begin, threads, 32, [&](std::int64_t lo, std::int64_t hi) {
    load_queries(args, std::int32_t(begin + lo), std::int32_t(begin + hi), q.data() + lo * row_len);
    for (std::int64_t i = lo; i < hi; ++i) {
      const std::int32_t p = step.position(std::int32_t(begin + i));
      const std::int64_t filled = p < 0 ? 0 : p / kBlockSize + 1;
      for (std::int64_t h = 0; h < heads; ++h) {
        float* row = scores + (i * heads + h) * stride;
        std::fill(row + filled, row + stride, kNegInf);
      }
    }
  });

  // One work item per (segment, block).
  const std::vector<Segment> segments = find_segments(step, begin, end);
  struct Item {
    std::int32_t segment, block;
  };
  std::vector<Item> items;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    for (std::int32_t b = 0; b <= segments[s].last_block(); ++b) items.push_back({std::int32_t(s), b});
  }

  const indexer::MaxDotsFn kernel = indexer::max_dots_kernel(indexer::best_isa());
  parallel_for(std::int64_t(items.size()), threads, 1, [&](std::int64_t lo, std::int64_t hi) {
    const auto keys = std::make_unique_for_overwrite<KeyBlock>();  // 64 KiB, not zeroed
    std::vector<std::int32_t> visible;
    for (std::int64_t i = lo; i < hi; ++i) {
      const Segment& s = segments[items[i].segment];
      const std::int32_t b = items[i].block;
      // Tokens [first, partial) have this block as their own (keys j <= p
      // only); tokens [partial, s.end) see all of it.
      const std::int32_t block_pos = b * kBlockSize;
      const std::int32_t first = s.begin + std::max(0, block_pos - s.first_pos);
      auto rows_of = [&](std::int32_t t) { return std::int64_t(t - begin) * heads; };
      const std::int64_t page = page_of(args, s.request, b);
      if (page < 0) {  // outside the table or the cache (unchecked input): no keys
        for (std::int64_t row = rows_of(first); row < rows_of(s.end); ++row) scores[row * stride + b] = kNaN;
        continue;
      }
      indexer::load_key_block(args.cache, page, *keys);
      const std::int32_t partial =
          std::min(s.end, s.begin + std::max(0, block_pos + kBlockSize - s.first_pos));
      if (partial > first) {
        visible.resize(std::size_t(partial - first) * heads);
        for (std::int32_t t = first; t < partial; ++t) {
          const std::int32_t p = s.first_pos + (t - s.begin);
          std::fill_n(visible.begin() + (t - first) * heads, heads, p - block_pos + 1);
        }
        kernel(q.data() + rows_of(first) * kHeadDim, rows_of(partial) - rows_of(first), *keys,
               visible.data(), scores + rows_of(first) * stride + b, stride);
      }
      if (s.end > partial) {
        kernel(q.data() + rows_of(partial) * kHeadDim, rows_of(s.end) - rows_of(partial), *keys,
               nullptr, scores + rows_of(partial) * stride + b, stride);
      }
    }
  });
}

// The views and the step always; the block-table entries when `data` (with
// them unchecked, a page outside the cache is skipped, never read).
void check_all(const StepView& step, const IndexerArgs& args, bool with_output, bool data) {
  if (with_output) check::indexer_shape(step, args);
  else check::indexer_inputs_shape(step, args);
  check::step_data(step);
  if (data) check::block_table_data(step, args.block_table, args.cache.num_pages, "block_table");
}

}  // namespace

void block_scores(const StepView& step, const IndexerArgs& args, float* scores, std::int32_t max_blocks,
                  const Options& opt) {
  check_options(opt);
  check_all(step, args, false, opt.check);
  if (step.num_tokens <= 0) return;
  MSA_CHECK(scores != nullptr, "block_scores: scores is null but the step has ", step.num_tokens,
            " tokens");
  MSA_CHECK(max_blocks >= 0, "block_scores: max_blocks = ", max_blocks, " is negative");
  const check::Span written = check::dense_view(
      scores, DType::f32,
      check::size_of("block_scores: scores", std::int64_t(step.num_tokens) * args.num_kv_heads, max_blocks),
      "block_scores: scores");
  check::no_overlap(written, check::dense_view(args.index_q, args.iq_dtype,
                                               std::int64_t(step.num_tokens) * args.num_kv_heads * kHeadDim,
                                               "indexer: index_q"));
  check::no_overlap(written, check::index_cache_span(args.cache));
  check::no_overlap(written, check::block_table_view(args.block_table, step.num_requests,
                                                     args.cache.num_pages, "indexer: block_table"));
  for (std::int32_t t = 0; t < step.num_tokens; ++t) {
    const std::int32_t p = step.position(t);
    MSA_CHECK(p < 0 || p / kBlockSize < max_blocks, "block_scores: max_blocks = ", max_blocks,
              " but token ", t, " at position ", p, " has ", p / kBlockSize + 1, " eligible blocks");
  }
  score_tokens(step, args, 0, step.num_tokens, scores, std::max(max_blocks, 0),
               resolve_threads(opt.num_threads));
}

void index(const StepView& step, const IndexerArgs& args, const Options& opt) {
  check_options(opt);
  check_all(step, args, true, opt.check);
  const int threads = resolve_threads(opt.num_threads);
  const std::int64_t heads = args.num_kv_heads;
  std::vector<float> scores;
  // Chunks of tokens whose scores fit the budget (at least one token each).
  for (std::int32_t begin = 0; begin < step.num_tokens;) {
    std::int32_t end = begin;
    std::int64_t stride = 1;
    while (end < step.num_tokens) {
      const std::int32_t p = step.position(end);
      const std::int64_t need = std::max<std::int64_t>(stride, p < 0 ? 1 : p / kBlockSize + 1);
      if (end > begin && (end - begin + 1) * heads * need > kScoreBudget) break;
      stride = need;
      ++end;
    }
    scores.resize(std::size_t(end - begin) * std::size_t(heads * stride));
    score_tokens(step, args, begin, end, scores.data(), stride, threads);
    parallel_for((end - begin) * heads, threads, 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t row = lo; row < hi; ++row) {
        const std::int32_t t = begin + std::int32_t(row / heads);
        const std::int32_t h = std::int32_t(row % heads);
        const std::int32_t p = step.position(t);
        select_row(scores.data() + row * stride, p < 0 ? -1 : p / kBlockSize, args.out.topk,
                   args.init_blocks, args.local_blocks, args.out.row(t, h));
      }
    });
    begin = end;
  }
}

}  // namespace msa::cpu
