// Sparse attention of the CPU engine (contract 6): one code path for decode,
// verify and prefill tokens. Work items are (KV head, token) pairs; an item
// walks its selected blocks in ascending id order (so the result does not depend
// on the order of the top-k entries) with an online softmax per query head of
// the group. Blocks are dequantized to fp32 once and shared through a small
// cache by the neighbouring tokens that select them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/checks.hpp"
#include "cpu/attention_blocks.hpp"
#include "cpu/parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu {

namespace {

constexpr int kLanes = 32;  // columns processed together (a multiple of the SIMD width)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-item working memory, one query group (up to 16 heads).
struct GroupState {
  alignas(64) float q[kMaxGroup][kHeadDim];     // query * softmax_scale
  alignas(64) float acc[kMaxGroup][kHeadDim];   // unnormalised output
  alignas(64) float s[kMaxGroup][kBlockSize];   // logits, then probabilities, of one block
  float m[kMaxGroup];                           // running max logit
  float l[kMaxGroup];                           // running sum of exp(logit - m)
};

float load_query(const void* q, DType dtype, std::int64_t i, float q_scale) {
  switch (dtype) {
    case DType::bf16: return num::bf16_to_float(static_cast<const std::uint16_t*>(q)[i]);
    case DType::fp16: return num::fp16_to_float(static_cast<const std::uint16_t*>(q)[i]);
    case DType::fp8_e4m3: return num::e4m3_to_float(static_cast<const std::uint8_t*>(q)[i]) * q_scale;
    default: fail("cpu::attend: q_dtype = ", dtype_name(dtype), " is not a query dtype");
  }
}

// s[g][j] = q[g] . K[j] for j < n (computed in whole chunks of kLanes columns).
void block_logits(const attn::Block& blk, int group, int n, GroupState& st) {
  for (int jc = 0; jc < n; jc += kLanes) {
    for (int g = 0; g < group; ++g) {
      float a[kLanes] = {};
      const float* q = st.q[g];  // [128]
      for (int d = 0; d < kHeadDim; ++d) {
        const float qd = q[d];
        const float* k = blk.kt[d] + jc;  // [kLanes]
        for (int l = 0; l < kLanes; ++l) a[l] += qd * k[l];
      }
      std::copy(a, a + kLanes, st.s[g] + jc);
    }
  }
}

// Online softmax step of head g over logits s[g][0, n): turns them into
// probabilities relative to the new running max and rescales acc. Returns
// false when the block adds nothing (every logit -inf).
bool softmax_step(int g, int n, GroupState& st) {
  float* s = st.s[g];  // [n]
  float mb = kNegInf;
  for (int j = 0; j < n; ++j) mb = s[j] > mb ? s[j] : mb;  // NaN never wins; it propagates below
  const float m_new = std::max(st.m[g], mb);
  if (m_new == kNegInf) return false;
  const float alpha = std::exp(st.m[g] - m_new);  // 0 on the first block
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m_new);
    sum += s[j];
  }
  st.l[g] = st.l[g] * alpha + sum;
  st.m[g] = m_new;
  if (alpha != 1.0f) {
    for (int d = 0; d < kHeadDim; ++d) st.acc[g][d] *= alpha;
  }
  return true;
}

// acc[g] += sum_j p[g][j] * V[j] over j < n.
void block_values(const attn::Block& blk, int g, int n, GroupState& st) {
  const float* p = st.s[g];  // [n]
  for (int dc = 0; dc < kHeadDim; dc += kLanes) {
    float a[kLanes];
    std::copy(st.acc[g] + dc, st.acc[g] + dc + kLanes, a);
    for (int j = 0; j < n; ++j) {
      const float pj = p[j];
      const float* v = blk.v[j] + dc;  // [kLanes]
      for (int l = 0; l < kLanes; ++l) a[l] += pj * v[l];
    }
    std::copy(a, a + kLanes, st.acc[g] + dc);
  }
}

void store_output(void* out, DType dtype, std::int64_t i, float x) {
  if (dtype == DType::bf16) static_cast<std::uint16_t*>(out)[i] = num::float_to_bf16(x);
  else static_cast<std::uint16_t*>(out)[i] = num::float_to_fp16(x);
}

// One work item: token t, KV head h, all query heads of h's group.
void attend_item(const StepView& step, const AttentionArgs& args, int group, std::int32_t t,
                 std::int32_t h, attn::BlockCache& blocks, GroupState& st) {
  const std::int32_t r = step.token_request[t];
  const std::int64_t p = step.position(t, r);
  const std::int64_t seq_len = step.seq_lens[r];

  // Selected blocks that hold keys for this token, ascending. Ids and pages
  // outside the table or the cache (possible only with opt.check off) are
  // skipped rather than read.
  std::int32_t ids[kMaxTopk];
  int num_ids = 0;
  const std::int32_t* row = args.topk.row(t, h);  // [topk]
  for (int k = 0; k < args.topk.topk; ++k) {
    const std::int64_t b = row[k];
    if (b < 0 || b >= args.block_table.max_blocks || p < 0 || args.cache.num_pages == 0) continue;
    if (b * kBlockSize > p || b * kBlockSize >= seq_len) continue;
    const std::int64_t page = args.block_table.at(r, b);
    if (page >= 0 && page < args.cache.num_pages) ids[num_ids++] = row[k];
  }
  std::sort(ids, ids + num_ids);
  num_ids = int(std::unique(ids, ids + num_ids) - ids);  // S is a set (duplicates: only unchecked)

  const std::int64_t head0 = std::int64_t(h) * group;
  const std::int64_t qrow = (std::int64_t(t) * args.num_q_heads + head0) * kHeadDim;
  for (int g = 0; g < group; ++g) {
    for (int d = 0; d < kHeadDim; ++d) {
      st.q[g][d] = load_query(args.q, args.q_dtype, qrow + g * kHeadDim + d, args.q_scale) *
                   args.softmax_scale;
      st.acc[g][d] = 0.0f;
    }
    st.m[g] = kNegInf;
    st.l[g] = 0.0f;
  }

  for (int i = 0; i < num_ids; ++i) {
    const std::int64_t first = std::int64_t(ids[i]) * kBlockSize;
    const auto rows = std::int32_t(std::min<std::int64_t>(kBlockSize, seq_len - first));
    const int n = int(std::min<std::int64_t>(rows, p + 1 - first));
    const attn::Block& blk = blocks.get(args.block_table.at(r, ids[i]), h, rows);
    block_logits(blk, group, n, st);
    for (int g = 0; g < group; ++g) {
      if (softmax_step(g, n, st)) block_values(blk, g, n, st);
    }
  }

  for (int g = 0; g < group; ++g) {
    const std::int64_t qh = std::int64_t(t) * args.num_q_heads + head0 + g;
    const bool empty = st.l[g] == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / st.l[g];
    for (int d = 0; d < kHeadDim; ++d) {
      store_output(args.out, args.out_dtype, qh * kHeadDim + d, st.acc[g][d] * inv);
    }
    if (args.lse) args.lse[qh] = empty ? kNegInf : st.m[g] + std::log(st.l[g]);
  }
}

}  // namespace

void attend(const StepView& step, const AttentionArgs& args, const Options& opt) {
  check_options(opt);
  check::attention_shape(step, args);
  check::step_data(step);
  if (opt.check) {
    check::block_table_data(step, args.block_table, args.cache.num_pages, "block_table");
    check::topk_data(step, args.topk, args.cache.num_kv_heads, 0, step.num_tokens);
  }
  const std::int32_t num_tokens = step.num_tokens;
  const int num_kv_heads = args.cache.num_kv_heads;
  const int group = args.num_q_heads / num_kv_heads;
  const std::int64_t items = std::int64_t(num_tokens) * num_kv_heads;
  if (items == 0) return;

  // Items are head-major so that a chunk holds neighbouring tokens of one head.
  const int threads = resolve_threads(opt.num_threads);
  const std::int64_t grain = std::clamp<std::int64_t>(items / (8 * std::int64_t(threads)), 1, 16);
  // Each concurrent chunk holds a cache of converted blocks (128 KiB each):
  // room for a token's selection and half again, within ~512 MiB in all.
  const std::int64_t budget_blocks = (std::int64_t(512) << 20) / sizeof(attn::Block) / threads;
  const int capacity =
      int(std::max<std::int64_t>(8, std::min<std::int64_t>(budget_blocks, args.topk.topk * 3 / 2 + 1)));
  attn::BlockCachePool pool(args.cache, capacity);
  parallel_for(items, threads, grain, [&](std::int64_t begin, std::int64_t end) {
    auto blocks = pool.acquire();
    auto st = std::make_unique<GroupState>();
    for (std::int64_t i = begin; i < end; ++i) {
      const auto h = std::int32_t(i / num_tokens);
      const auto t = std::int32_t(i % num_tokens);
      attend_item(step, args, group, t, h, *blocks, *st);
    }
    pool.release(std::move(blocks));
  });
}

}  // namespace msa::cpu
