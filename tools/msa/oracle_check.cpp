#include "oracle_check.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "cache_reader.hpp"
#include "compare.hpp"
#include "msa/error.hpp"
#include "msa/select.hpp"
#include "oracle.hpp"

namespace msa::tool {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Evenly spread picks of `want` items out of [begin, end), always with the two
// first and two last ones when there is room.
void spread(std::int32_t begin, std::int32_t end, int want, std::set<std::int32_t>& out) {
  const std::int32_t n = end - begin;
  if (n <= 0 || want <= 0) return;
  if (n <= want) {
    for (std::int32_t t = begin; t < end; ++t) out.insert(t);
    return;
  }
  for (std::int32_t t : {begin, begin + 1, end - 2, end - 1}) out.insert(t);
  for (int i = 0; i < want - 4; ++i)
    out.insert(begin + std::int32_t(std::int64_t(n) * (2 * i + 1) / (2 * (want - 4))));
}

// Dense index keys of request r as double: [seq_len, 128].
std::vector<double> read_index_keys(Workload& w, std::int32_t r) {
  const IndexCacheView cache = w.index_view();
  const std::int64_t seq = w.meta().seq_lens[r];
  std::vector<double> ik(std::size_t(seq) * kHeadDim);
  for (std::int64_t j = 0; j < seq; ++j)
    ref::read_index_row(cache, w.index_page(r, std::int32_t(j / kBlockSize)), j % kBlockSize,
                        ik.data() + j * kHeadDim);
  return ik;
}

// Checks one (token, head) selection against float64 block scores; returns a
// problem in words ("" if fine) and raises `gap` to the row's worst gap.
//   row: [topk], iq: [num_tokens, num_kv_heads, 128], ik: [seq_len, 128] of t's request
std::string check_selection(const Workload& w, std::int32_t t, std::int32_t h,
                            const std::int32_t* row, const std::vector<double>& iq,
                            const std::vector<double>& ik, const Tolerance& tol, double& gap) {
  const ModelConfig& m = w.model();
  const std::int32_t p = w.meta().token_position[t];
  const auto where = [&] { return detail::concat("topk[t=", t, ", h=", h, "]"); };
  if (p < 0) {
    for (int k = 0; k < m.topk; ++k) {
      if (row[k] != -1)
        return detail::concat(where(), "[", k, "] = ", row[k], " but the row is padding");
    }
    return "";
  }
  const std::int32_t last = p / kBlockSize;
  const std::int32_t valid = select::num_valid(last, m.topk);
  std::vector<char> chosen(std::size_t(last) + 1, 0);
  for (int k = 0; k < m.topk; ++k) {
    const std::int32_t id = row[k];
    if (k >= valid) {
      if (id != -1)
        return detail::concat(where(), "[", k, "] = ", id, " but only ", valid,
                              " entries are valid");
      continue;
    }
    if (id < 0 || id > last)
      return detail::concat(where(), "[", k, "] = ", id, " is not in [0, ", last, "]");
    if (k > 0 && id <= row[k - 1])
      return detail::concat(where(), "[", k, "] = ", id, " is not above the entry before it");
    chosen[id] = 1;
  }
  // Scores in float64: max over the block's tokens j <= p of iq . ik[j].
  std::vector<double> score(std::size_t(last) + 1, kNegInf);
  const double* q = iq.data() + (std::size_t(t) * m.num_kv_heads + h) * kHeadDim;
  for (std::int64_t j = 0; j <= p; ++j) {
    double s = 0.0;
    for (int d = 0; d < kHeadDim; ++d) s += q[d] * ik[j * kHeadDim + d];
    if (std::isnan(s)) s = kNegInf;
    score[j / kBlockSize] = std::max(score[j / kBlockSize], s);
  }
  double lowest_chosen = std::numeric_limits<double>::infinity(), best_left = kNegInf;
  std::int32_t lowest_id = -1, best_id = -1;
  for (std::int32_t b = 0; b <= last; ++b) {
    const bool forced = select::is_forced(b, last, m.init_blocks, m.local_blocks);
    if (forced && !chosen[b]) return detail::concat(where(), " misses forced block ", b);
    if (forced) continue;
    if (chosen[b] && score[b] < lowest_chosen) lowest_chosen = score[b], lowest_id = b;
    if (!chosen[b] && score[b] > best_left) best_left = score[b], best_id = b;
  }
  if (lowest_id < 0 || best_id < 0) return "";
  const double g = best_left - lowest_chosen;
  gap = std::max(gap, g);
  // The engine's scores are fp32 (or coarser): allow their error.
  if (g > tol.index_gap_abs + tol.index_gap_rel * std::fabs(lowest_chosen)) {
    return detail::concat(where(), " selects block ", lowest_id, " (score ", lowest_chosen,
                          ") but leaves out block ", best_id, " (score ", best_left, ")");
  }
  return "";
}

// Folds one row's comparisons into the result.
void record_row(std::int32_t t, const ref::Comparison& out, const ref::Comparison& lse,
                CheckResult& res) {
  res.nonfinite_mismatches += out.mismatches + lse.mismatches;
  if (res.worst_out_row < 0 || out.rel_frobenius > res.max_out_rel) {
    res.max_out_rel = out.rel_frobenius;
    res.worst_out_row = t;
  }
  if (res.worst_lse_row < 0 || lse.max_abs > res.max_lse_abs) {
    res.max_lse_abs = lse.max_abs;
    res.worst_lse_row = t;
  }
  if (!out.rel_ok(res.tol.out_rel) && res.out_problem.empty()) {
    res.out_problem = detail::concat("row ", t, ": ", out.describe());
  }
  if (!lse.abs_ok(res.tol.lse_abs) && res.lse_problem.empty()) {
    res.lse_problem = detail::concat("row ", t, ": ", lse.describe());
  }
}

}  // namespace

Tolerance contract_tolerance(bool fp8_arithmetic) {
  Tolerance t;
  t.out_rel = fp8_arithmetic ? 2e-2 : 1e-2;
  t.lse_abs = 1e-3;
  return t;
}

std::vector<std::int32_t> sample_rows(const BatchMetadata& meta, int decode_rows,
                                      int prefill_rows) {
  std::set<std::int32_t> rows;
  const std::int32_t nd = meta.num_decode_tokens;
  if (nd <= decode_rows) {
    for (std::int32_t t = 0; t < nd; ++t) rows.insert(t);
  } else {
    for (int i = 0; i < decode_rows; ++i)
      rows.insert(std::int32_t(std::int64_t(nd) * i / decode_rows));
  }
  const int per_prefill = meta.num_prefills ? std::max(4, prefill_rows / meta.num_prefills) : 0;
  for (std::int32_t r = meta.num_decodes; r < meta.num_requests; ++r) {
    spread(meta.query_start[r], meta.query_start[r + 1], per_prefill, rows);
  }
  return {rows.begin(), rows.end()};
}

CheckResult check_rows(Workload& w, const std::vector<std::int32_t>& rows, const Tolerance& tol) {
  CheckResult res;
  res.tol = tol;
  res.rows = rows;
  const BatchMetadata& meta = w.meta();
  const ModelConfig& m = w.model();
  const std::int64_t QH = m.num_q_heads, H = m.num_kv_heads, G = m.group(), D = kHeadDim;
  const AttentionArgs args = w.attention_args();
  const std::vector<double> q = ref::read_query(args, meta.num_tokens);  // [T, QH, 128]
  const IndexerArgs index_args = w.indexer_args();  // the index query the engine read
  const std::vector<double> iq =
      ref::read_array(index_args.index_q, index_args.iq_dtype, std::int64_t(meta.num_tokens) * H * D);
  const std::size_t out_bytes = dtype_bytes(w.out_dtype());

  std::size_t first = 0;
  while (first < rows.size()) {
    const std::int32_t r = meta.token_request[rows[first]];
    std::size_t end = first;
    while (end < rows.size() && meta.token_request[rows[end]] == r) ++end;
    const std::size_t n = end - first;
    std::vector<double> want(n * QH * D), want_lse(n * QH);
    const std::vector<double> ik = read_index_keys(w, r);
    for (std::int32_t h = 0; h < H; ++h) {
      const ref::HeadKV kv = ref::read_kv(args.cache, args.block_table, r, h, meta.seq_lens[r]);
      for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t t = rows[first + i];
        const std::int32_t* row = args.topk.row(t, h);
        std::string problem = check_selection(w, t, h, row, iq, ik, res.tol, res.index_worst_gap);
        ++res.index_rows;
        if (!problem.empty()) {
          ++res.index_bad_rows;
          if (res.index_problem.empty()) res.index_problem = problem;
        }
        // The contract's key set: j // 128 selected, j <= p (< seq_len).
        const std::int64_t nk = std::max(meta.token_position[t] + 1, 0);
        std::vector<std::uint8_t> mask(std::size_t(G * nk), 0);
        for (int k = 0; k < m.topk; ++k) {
          const std::int64_t b = row[k];
          if (b < 0 || b * kBlockSize >= nk) continue;
          std::fill(mask.begin() + b * kBlockSize,
                    mask.begin() + std::min(nk, (b + 1) * kBlockSize), 1);
        }
        for (std::int64_t g = 1; g < G; ++g) std::copy_n(mask.begin(), nk, mask.begin() + g * nk);
        ref::masked_attention(q.data() + (t * QH + h * G) * D, kv.k.data(), kv.v.data(),
                              mask.data(), G, nk, m.softmax_scale,
                              want.data() + (i * QH + h * G) * D, want_lse.data() + i * QH + h * G);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::int32_t t = rows[first + i];
      const std::vector<double> got = ref::read_array(
          w.out.data() + std::size_t(t) * QH * D * out_bytes, w.out_dtype(), QH * D);
      const std::vector<double> got_lse(w.lse.begin() + t * QH, w.lse.begin() + (t + 1) * QH);
      record_row(t, ref::compare(got.data(), want.data() + i * QH * D, QH * D, "out"),
                 ref::compare_lse(got_lse.data(), want_lse.data() + i * QH, QH, "lse"), res);
    }
    first = end;
  }
  return res;
}

}  // namespace msa::tool
