// Helpers shared by the test_attention_*.cpp files: a hand-built step, caches
// written by the test's own quantizer (msa/numeric.hpp encoders and the
// contract's formulas), top-k lists, and the float64 reference of a whole step
// (cache reader + the contract's key set as an explicit mask + the oracle).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cache_reader.hpp"
#include "compare.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "msa/ops.hpp"
#include "oracle.hpp"

namespace attn_test {

using msa::DType;
using msa::Layout;
using msa::ScaleMode;
constexpr int D = msa::kHeadDim;
constexpr int N = msa::kBlockSize;

inline std::int32_t blocks_of(std::int64_t seq_len) { return std::int32_t((seq_len + N - 1) / N); }

// ---- step ------------------------------------------------------------------------
struct Request {
  std::int32_t query_len = 0;
  std::int32_t seq_len = 0;  // 0: padding request
};

struct Step {
  std::vector<Request> requests;
  std::vector<std::int32_t> query_start, seq_lens, token_request;
  msa::StepView view;
  std::int32_t position(std::int32_t t) const { return view.position(t); }
};

// The first `num_decodes` requests are decodes (all of the same query length).
inline Step make_step(const std::vector<Request>& requests, int num_decodes = 0) {
  Step s;
  s.requests = requests;
  s.query_start.push_back(0);
  for (std::size_t r = 0; r < requests.size(); ++r) {
    s.seq_lens.push_back(requests[r].seq_len);
    for (int i = 0; i < requests[r].query_len; ++i) s.token_request.push_back(std::int32_t(r));
    s.query_start.push_back(s.query_start.back() + requests[r].query_len);
  }
  s.view.num_requests = std::int32_t(requests.size());
  s.view.num_tokens = s.query_start.back();
  s.view.num_decodes = num_decodes;
  s.view.decode_query_len = num_decodes > 0 ? requests[0].query_len : 0;
  s.view.num_decode_tokens = s.query_start[num_decodes];
  s.view.query_start = s.query_start.data();
  s.view.seq_lens = s.seq_lens.data();
  s.view.token_request = s.token_request.data();
  return s;
}

// ---- cache -----------------------------------------------------------------------
struct CacheSpec {
  DType dtype = DType::bf16;
  Layout layout = Layout::hnd;
  ScaleMode scale_mode = ScaleMode::none;  // fp8: per_tensor unless per_token_head
  int num_kv_heads = 1;
  std::int64_t extra_page_stride = 0;  // elements (bytes for nvfp4) added to one page
};

inline const char* scale_name(ScaleMode m) {
  return m == ScaleMode::per_token_head ? "per_token_head" : m == ScaleMode::per_tensor ? "per_tensor" : "none";
}
inline std::string describe(const CacheSpec& c) {
  return std::string(msa::dtype_name(c.dtype)) + "/" + msa::layout_name(c.layout) + "/" +
         scale_name(c.scale_mode) + "/heads=" + std::to_string(c.num_kv_heads) +
         "/extra_stride=" + std::to_string(c.extra_page_stride);
}

// A cache and its block table. Every byte starts as NaN (0xFF decodes to NaN
// in every KV dtype), so a read of anything never written shows up.
struct Cache {
  CacheSpec spec;
  std::vector<std::uint8_t> bytes;
  std::vector<float> k_scales, v_scales;  // per_token_head: [num_pages * 128, num_kv_heads]
  std::vector<std::int32_t> table;        // [num_requests, max_blocks]
  std::int32_t max_blocks = 0;
  msa::KVCacheView view;
  msa::BlockTable block_table() const {
    return msa::BlockTable{table.data(), std::int32_t(table.size() / std::max(max_blocks, 1)),
                           max_blocks, max_blocks};
  }
};

// Pages for every request's blocks, shuffled over the cache, plus `spare` unused pages.
inline Cache make_cache(const CacheSpec& spec, const Step& step, std::mt19937& rng, int spare = 3) {
  Cache c;
  c.spec = spec;
  std::int64_t pages = spare;
  for (const Request& r : step.requests) {
    c.max_blocks = std::max(c.max_blocks, blocks_of(r.seq_len));
    pages += blocks_of(r.seq_len);
  }
  c.max_blocks = std::max(c.max_blocks, 1);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.table.assign(step.requests.size() * c.max_blocks, -1);
  std::size_t next = 0;
  for (std::size_t r = 0; r < step.requests.size(); ++r) {
    for (int b = 0; b < blocks_of(step.requests[r].seq_len); ++b) c.table[r * c.max_blocks + b] = perm[next++];
  }
  if (spec.dtype == DType::nvfp4) {
    const std::int64_t stride = 2 * spec.num_kv_heads * msa::nvfp4::kSlotBytes + spec.extra_page_stride;
    c.bytes.assign(static_cast<std::size_t>(pages * stride), 0xFF);
    c.view = msa::make_nvfp4_cache_view(c.bytes.data(), pages, spec.num_kv_heads, 0.0625f, 0.03125f, stride);
    return c;
  }
  const std::int64_t page = std::int64_t(spec.num_kv_heads) * N * 2 * D;
  const std::int64_t stride = page + spec.extra_page_stride;
  c.bytes.assign(static_cast<std::size_t>(pages * stride * msa::dtype_bytes(spec.dtype)), 0xFF);
  c.view = msa::make_cache_view(spec.dtype, c.bytes.data(), pages, spec.num_kv_heads, spec.layout, stride);
  if (msa::is_fp8(spec.dtype)) {
    c.view.scale_mode = spec.scale_mode == ScaleMode::per_token_head ? ScaleMode::per_token_head
                                                                     : ScaleMode::per_tensor;
    c.view.k_scale = 0.02f;
    c.view.v_scale = 0.015f;
    if (c.view.scale_mode == ScaleMode::per_token_head) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      c.k_scales.assign(static_cast<std::size_t>(pages * N * spec.num_kv_heads), nan);
      c.v_scales.assign(c.k_scales.size(), nan);
      c.view.k_scales = c.k_scales.data();
      c.view.v_scales = c.v_scales.data();
    }
  }
  return c;
}

// Logical K and V of every request: [seq_len, num_kv_heads, 128] floats each.
struct LogicalKV {
  std::vector<std::vector<float>> k, v;
};

inline LogicalKV random_kv(const Step& step, int num_kv_heads, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  LogicalKV kv;
  for (const Request& r : step.requests) {
    const std::size_t n = std::size_t(r.seq_len) * num_kv_heads * D;
    std::vector<float> k(n), v(n);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    kv.k.push_back(std::move(k));
    kv.v.push_back(std::move(v));
  }
  return kv;
}

// The test's own quantizer: writes one token row x[128] of (page, head, token).
inline void write_row(Cache& c, std::int64_t page, int head, int token, int is_v, const float* x) {
  const msa::KVCacheView& v = c.view;
  if (v.dtype == DType::nvfp4) {
    auto* slot = c.bytes.data() + msa::nvfp4::slot_offset(v, page, head, is_v);
    const float global = is_v ? v.v_scale : v.k_scale;
    for (int g = 0; g < D / msa::nvfp4::kGroup; ++g) {
      float amax = 0.0f;
      for (int i = 0; i < msa::nvfp4::kGroup; ++i) amax = std::max(amax, std::fabs(x[16 * g + i]));
      const std::uint8_t sf = msa::num::nvfp4_group_scale(amax, global);
      slot[msa::nvfp4::scale_offset(token, g)] = sf;
      for (int i = 0; i < msa::nvfp4::kGroup; i += 2) {
        const int e = 16 * g + i;
        const std::uint8_t lo = msa::num::nvfp4_encode(x[e], sf, global);
        const std::uint8_t hi = msa::num::nvfp4_encode(x[e + 1], sf, global);
        slot[msa::nvfp4::data_offset(token, e / 2)] = std::uint8_t(lo | (hi << 4));
      }
    }
    return;
  }
  const std::int64_t at = v.offset(page, head, token, 0);
  void* base = is_v ? v.v : v.k;
  if (v.dtype == DType::bf16 || v.dtype == DType::fp16) {
    auto* p = static_cast<std::uint16_t*>(base) + at;
    for (int d = 0; d < D; ++d) p[d] = v.dtype == DType::bf16 ? msa::num::float_to_bf16(x[d]) : msa::num::float_to_fp16(x[d]);
    return;
  }
  float scale = is_v ? v.v_scale : v.k_scale;
  if (v.scale_mode == ScaleMode::per_token_head) {
    float amax = 0.0f;
    for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
    scale = amax > 0.0f ? amax / msa::fp8_max(v.dtype) : 1.0f;
    (is_v ? c.v_scales : c.k_scales)[v.scale_index(page, head, token)] = scale;
  }
  auto* p = static_cast<std::uint8_t*>(base) + at;
  for (int d = 0; d < D; ++d) {
    p[d] = v.dtype == DType::fp8_e4m3 ? msa::num::float_to_e4m3(x[d] / scale) : msa::num::float_to_e5m2(x[d] / scale);
  }
}

inline void write_kv(Cache& c, const Step& step, const LogicalKV& kv) {
  const int H = c.spec.num_kv_heads;
  for (std::size_t r = 0; r < step.requests.size(); ++r) {
    for (int j = 0; j < step.requests[r].seq_len; ++j) {
      const std::int64_t page = c.table[r * c.max_blocks + j / N];
      for (int h = 0; h < H; ++h) {
        const std::size_t at = (std::size_t(j) * H + h) * D;
        write_row(c, page, h, j % N, 0, kv.k[r].data() + at);
        write_row(c, page, h, j % N, 1, kv.v[r].data() + at);
      }
    }
  }
}

// ---- queries -----------------------------------------------------------------------
// [num_tokens, num_q_heads, 128] in bf16 / fp16, or fp8 e4m3 codes of x / q_scale.
inline std::vector<std::uint8_t> random_query(std::int64_t n, DType dtype, float q_scale, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::uint8_t> q(static_cast<std::size_t>(n * msa::dtype_bytes(dtype)));
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = nd(rng);
    if (dtype == DType::fp8_e4m3) q[i] = msa::num::float_to_e4m3(x / q_scale);
    else reinterpret_cast<std::uint16_t*>(q.data())[i] = dtype == DType::bf16 ? msa::num::float_to_bf16(x) : msa::num::float_to_fp16(x);
  }
  return q;
}

// ---- top-k ------------------------------------------------------------------------
enum class Pick { all, random };

// [num_tokens, num_kv_heads, topk]: `all` lists every eligible block (needs
// topk > p / 128); `random` keeps the local block and fills up to
// min(topk, p/128 + 1) entries with random others. Valid entries are ascending
// unless `shuffle`, then -1. Padding rows are all -1.
inline std::vector<std::int32_t> make_topk(const Step& step, int num_kv_heads, int topk, Pick pick,
                                           std::mt19937& rng, bool shuffle = false) {
  std::vector<std::int32_t> ids(std::size_t(step.view.num_tokens) * num_kv_heads * topk, -1);
  for (std::int32_t t = 0; t < step.view.num_tokens; ++t) {
    const std::int32_t p = step.position(t);
    if (p < 0) continue;
    const std::int32_t last = p / N;
    for (int h = 0; h < num_kv_heads; ++h) {
      std::int32_t* row = ids.data() + (std::size_t(t) * num_kv_heads + h) * topk;
      std::vector<std::int32_t> chosen;
      if (pick == Pick::all) {
        EXPECT_LE(last + 1, topk) << "Pick::all needs topk > p / 128";
        for (std::int32_t b = 0; b <= last && b < topk; ++b) chosen.push_back(b);
      } else {
        std::vector<std::int32_t> others(static_cast<std::size_t>(last));
        std::iota(others.begin(), others.end(), 0);
        std::shuffle(others.begin(), others.end(), rng);
        const int valid = std::min(topk, last + 1);
        chosen.assign(others.begin(), others.begin() + (valid - 1));
        chosen.push_back(last);
        std::sort(chosen.begin(), chosen.end());
      }
      if (shuffle) std::shuffle(chosen.begin(), chosen.end(), rng);
      std::copy(chosen.begin(), chosen.end(), row);
    }
  }
  return ids;
}

// ---- one attention call -----------------------------------------------------------
struct Problem {
  Step step;
  Cache cache;
  int num_q_heads = 1;
  DType q_dtype = DType::bf16;
  DType out_dtype = DType::bf16;
  float q_scale = 1.0f;
  std::vector<std::uint8_t> q;
  std::vector<std::int32_t> topk;
  int topk_width = 16;

  msa::AttentionArgs args(void* out, float* lse) {
    msa::AttentionArgs a;
    a.q = q.data();
    a.q_dtype = q_dtype;
    a.q_scale = q_scale;
    a.out = out;
    a.out_dtype = out_dtype;
    a.lse = lse;
    a.num_q_heads = num_q_heads;
    a.topk = msa::TopkView::token_major(topk.data(), cache.spec.num_kv_heads, topk_width);
    a.cache = cache.view;
    a.block_table = cache.block_table();
    return a;
  }
};

struct Result {
  std::vector<std::uint16_t> out;  // [num_tokens, num_q_heads, 128] bf16 / fp16 bits
  std::vector<float> lse;          // [num_tokens, num_q_heads]
};

// Runs cpu::attend on NaN-poisoned outputs.
inline Result run(Problem& pb, const msa::cpu::Options& opt = {}) {
  const std::size_t rows = std::size_t(pb.step.view.num_tokens) * pb.num_q_heads;
  Result res;
  res.out.assign(rows * D, 0x7FFF);
  res.lse.assign(rows, std::numeric_limits<float>::quiet_NaN());
  msa::cpu::attend(pb.step.view, pb.args(res.out.data(), res.lse.data()), opt);
  return res;
}

struct Reference {
  std::vector<double> out;  // [num_tokens, num_q_heads, 128]
  std::vector<double> lse;  // [num_tokens, num_q_heads]
};

// The float64 reference: for token t (request r, position p), KV head h,
// keys = { j < seq_len(r) : j / 128 listed in topk[t, h], j <= p } as an explicit mask.
inline Reference reference(Problem& pb) {
  const Step& s = pb.step;
  const int H = pb.cache.spec.num_kv_heads, G = pb.num_q_heads / H;
  const auto T = s.view.num_tokens;
  const msa::AttentionArgs a = pb.args(nullptr, nullptr);
  const std::vector<double> q = msa::ref::read_query(a, T);
  Reference ref;
  ref.out.assign(std::size_t(T) * pb.num_q_heads * D, 0.0);
  ref.lse.assign(std::size_t(T) * pb.num_q_heads, 0.0);
  for (std::int32_t r = 0; r < s.view.num_requests; ++r) {
    const std::int32_t seq = s.seq_lens[r];
    for (int h = 0; h < H; ++h) {
      const msa::ref::HeadKV kv = msa::ref::read_kv(a.cache, a.block_table, r, h, seq);
      std::vector<std::uint8_t> mask(static_cast<std::size_t>(std::max(seq, 1)));
      for (std::int32_t t = s.query_start[r]; t < s.query_start[r + 1]; ++t) {
        const std::int32_t p = s.position(t);
        std::vector<bool> selected(std::size_t(blocks_of(seq)) + 1, false);
        const std::int32_t* row = pb.topk.data() + (std::size_t(t) * H + h) * pb.topk_width;
        for (int k = 0; k < pb.topk_width; ++k) {
          if (row[k] >= 0 && row[k] < blocks_of(seq)) selected[row[k]] = true;
        }
        for (std::int32_t j = 0; j < seq; ++j) mask[j] = selected[j / N] && j <= p;
        for (int g = 0; g < G; ++g) {
          const std::size_t qh = std::size_t(t) * pb.num_q_heads + std::size_t(h) * G + g;
          msa::ref::masked_attention(q.data() + qh * D, kv.k.data(), kv.v.data(), mask.data(), 1, seq,
                                     a.softmax_scale, ref.out.data() + qh * D, ref.lse.data() + qh);
        }
      }
    }
  }
  return ref;
}

inline std::vector<double> out_as_double(const Problem& pb, const Result& res) {
  return msa::ref::read_array(res.out.data(), pb.out_dtype, std::int64_t(res.out.size()));
}
inline std::vector<double> lse_as_double(const Result& res) {
  return std::vector<double>(res.lse.begin(), res.lse.end());
}

// Engine against the float64 reference: rel Frobenius of every token's output
// row <= out_tol, lse within lse_tol.
inline void expect_matches_reference(Problem& pb, const Result& res, double out_tol = 1e-2,
                                     double lse_tol = 1e-3) {
  const Reference ref = reference(pb);
  const auto c = msa::ref::compare_rows(out_as_double(pb, res), ref.out, std::int64_t(pb.num_q_heads) * D, "out");
  EXPECT_TRUE(c.rel_ok(out_tol)) << c.describe();
  const auto l = msa::ref::compare_lse(lse_as_double(res), ref.lse, "lse");
  EXPECT_TRUE(l.abs_ok(lse_tol)) << l.describe();
}

// A problem of unit-variance random data: the step's caches written, query drawn,
// top-k picked.
struct ProblemSpec {
  std::vector<Request> requests;
  int num_decodes = 0;
  CacheSpec cache;
  int num_q_heads = 1;
  int topk = 16;
  Pick pick = Pick::random;
  bool shuffle_topk = false;
  DType q_dtype = DType::bf16;
  DType out_dtype = DType::bf16;
  float q_scale = 1.0f;
};

inline Problem make_problem(const ProblemSpec& ps, std::mt19937& rng) {
  Problem pb;
  pb.step = make_step(ps.requests, ps.num_decodes);
  pb.cache = make_cache(ps.cache, pb.step, rng);
  pb.cache.view.k_scales = pb.cache.k_scales.empty() ? nullptr : pb.cache.k_scales.data();
  pb.cache.view.v_scales = pb.cache.v_scales.empty() ? nullptr : pb.cache.v_scales.data();
  write_kv(pb.cache, pb.step, random_kv(pb.step, ps.cache.num_kv_heads, rng));
  pb.num_q_heads = ps.num_q_heads;
  pb.q_dtype = ps.q_dtype;
  pb.out_dtype = ps.out_dtype;
  pb.q_scale = ps.q_scale;
  pb.q = random_query(std::int64_t(pb.step.view.num_tokens) * ps.num_q_heads * D, ps.q_dtype, ps.q_scale, rng);
  pb.topk_width = ps.topk;
  pb.topk = make_topk(pb.step, ps.cache.num_kv_heads, ps.topk, ps.pick, rng, ps.shuffle_topk);
  return pb;
}

}  // namespace attn_test
