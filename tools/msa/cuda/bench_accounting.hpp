// What `msa bench` measures and how it counts: the cases, the FLOP and byte
// accounting, the number of rotated input copies and the timing summary.
// Pure host functions (no CUDA), unit-tested in tests/unit/test_bench_accounting.cpp.
// The case lists are in bench_sets.hpp.
//
// Accounting (bench/README.md):
//  - attend FLOPs = 4 * 128 * sum over (token, query head) of the keys it really
//    attends: positions j with j / 128 among its valid top-k ids, j <= p and
//    j < seq_len (causal limit included); 2 * 128 for q.k and 2 * 128 for p.v.
//  - attend bytes = K + V bytes (and fp8 per-token scales) of every distinct
//    (request, KV head, block) that some row of the request selected.
//  - index FLOPs = 2 * 128 * sum over (token, KV head) of the keys it scores
//    (p + 1); index bytes = the index-cache blocks of each request, once.
//  - insert bytes = the new tokens' K, V and index keys read (bf16) and
//    written (in the caches' dtypes), and their slots read.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_topk.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"

namespace msa::tool {

// ---- cases -------------------------------------------------------------------
// attend: cuda::attend; index: cuda::index; layer: one engine step of one
// sparse layer, insert + index + attend (the attention reads the top-k the
// indexer just wrote); pre_attention: cuda::pre_attention on `batch` tokens
// (bench_pre_attention.hpp).
enum class BenchOp : std::uint8_t { attend, index, layer, pre_attention };

inline const char* op_name(BenchOp op) {
  static constexpr const char* kNames[] = {"attend", "index", "layer", "pre_attention"};
  return kNames[int(op)];
}

struct BenchCase {
  BenchOp op = BenchOp::attend;
  bool prefill = false;           // `batch` chunked-prefill requests; else decode / verify
  int num_q_heads = 16;
  int num_kv_heads = 1;
  DType dtype = DType::bf16;      // attend, layer: the KV cache dtype; index: the index cache dtype
  std::int32_t context = 8192;    // cached tokens of every request before the step
  std::int32_t batch = 1;         // requests
  std::int32_t query_len = 1;     // new tokens per request
  std::int32_t topk = 16;
  DType index_dtype = DType::bf16;         // layer: the index cache dtype (bf16, fp8_e4m3, nvfp4)
  std::optional<TopkPattern> pattern = std::nullopt;  // the case's own top-k pattern; none: the run's (--pattern)
  double shared = 0.5;  // pattern partial: the fraction of a prefill token's ids from its request's set

  std::int64_t num_tokens() const { return std::int64_t(batch) * query_len; }
  // seq_len of every request: the cached context plus the step's new tokens.
  std::int32_t seq_len() const { return context + query_len; }
  const char* mode() const { return prefill ? "prefill" : (query_len > 1 ? "verify" : "decode"); }
  // e.g. "attend prefill 16/1 bf16 ctx=170K b=4 q=1536", "attend verify 64/4 fp8_e4m3 ctx=32K b=128 q=4",
  // "layer decode 16/1 bf16 index=nvfp4 ctx=128K b=128 q=1", "attend prefill 16/1 fp8_e4m3 ctx=32K b=1 q=4096 random",
  // "attend prefill 64/4 bf16 ctx=32K b=1 q=4096 partial=0.75"
  std::string name() const {
    std::ostringstream s;
    if (op == BenchOp::pre_attention) {  // e.g. "pre_attention 64/4 nvfp4 n=4096" (batch: the tokens)
      s << "pre_attention " << num_q_heads << '/' << num_kv_heads << ' ' << dtype_name(dtype) << " n=" << batch;
      return s.str();
    }
    s << op_name(op) << ' ' << mode() << ' ' << num_q_heads << '/' << num_kv_heads << ' ' << dtype_name(dtype);
    if (op == BenchOp::layer) s << " index=" << dtype_name(index_dtype);
    s << " ctx=";
    if (context % 1024 == 0) s << context / 1024 << 'K';
    else s << context;
    s << " b=" << batch << " q=" << query_len;
    if (pattern) s << ' ' << pattern_name(*pattern);
    if (pattern == TopkPattern::partial) s << '=' << std::fixed << std::setprecision(2) << shared;
    return s.str();
  }
};

// The top-k pattern a case runs with: its own, else the run's (--pattern),
// else random for attend and clustered for layer cases (whose index keys and
// queries are made so that the indexer selects runs of neighbouring blocks,
// bench_directed.hpp). Index cases score every block whatever the pattern.
inline TopkPattern case_pattern(const BenchCase& c, std::optional<TopkPattern> run) {
  if (c.pattern) return *c.pattern;
  if (run) return *run;
  return c.op == BenchOp::layer ? TopkPattern::clustered : TopkPattern::random;
}

// The top-k lists of an attend case's input copy `copy` under the run's seed:
// [num_tokens, num_kv_heads, topk] (bench_topk.hpp).
inline std::vector<std::int32_t> case_topk(const BenchCase& c, const BatchMetadata& m, TopkPattern pattern,
                                           std::uint64_t seed, int copy) {
  return make_bench_topk(m.query_start, m.seq_lens, c.num_kv_heads, c.topk, c.prefill, pattern,
                         mix64(seed * 977 + std::uint64_t(copy)), c.shared);
}

// The index query dtype of a layer case: the fp8 e4m3 index cache scores an
// fp8 e4m3 query (cast like the keys), the others a bf16 one.
inline DType index_query_dtype(DType index_dtype) {
  return index_dtype == DType::fp8_e4m3 ? DType::fp8_e4m3 : DType::bf16;
}

// The step of a case: `batch` identical requests of `query_len` new tokens on
// `context` cached ones; all prefills (threshold 1) or all decodes / verifies.
inline BatchSpec bench_batch_spec(const BenchCase& c) {
  BatchSpec spec;
  spec.query_lens.assign(std::size_t(c.batch), c.query_len);
  spec.seq_lens.assign(std::size_t(c.batch), c.seq_len());
  spec.decode_threshold = c.prefill ? 1 : c.query_len;
  return spec;
}

inline BenchCase make_bench_case(BenchOp op, bool prefill, int qh, int kvh, DType dt, std::int32_t ctx,
                                 std::int32_t batch, std::int32_t query_len) {
  BenchCase c;
  c.op = op;
  c.prefill = prefill;
  c.num_q_heads = qh;
  c.num_kv_heads = kvh;
  c.dtype = dt;
  c.context = ctx;
  c.batch = batch;
  c.query_len = query_len;
  return c;
}

inline std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// A case matches a filter when every word of the filter is a word of its name
// ("decode 64/4 b=128" picks the 64/4 decodes of batch 128). No filters: all.
inline bool matches_any(const BenchCase& c, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  const std::vector<std::string> name = split_words(c.name());
  for (const std::string& f : filters) {
    bool all = true;
    for (const std::string& w : split_words(f)) all = all && std::find(name.begin(), name.end(), w) != name.end();
    if (all) return true;
  }
  return false;
}

// ---- accounting ----------------------------------------------------------------
// Bytes one KV head's block occupies: K and V, plus the per-token fp8 scales.
inline std::int64_t kv_block_bytes(DType dtype, ScaleMode mode) {
  if (dtype == DType::nvfp4) return 2 * nvfp4::kSlotBytes;
  std::int64_t b = 2 * std::int64_t(kBlockSize) * kHeadDim * std::int64_t(dtype_bytes(dtype));
  if (mode == ScaleMode::per_token_head) b += 2 * std::int64_t(kBlockSize) * 4;
  return b;
}

// Keys one (token, KV head) row attends: j with j / 128 among the valid ids,
// j <= p and j < seq_len. Negative ids are skipped; p < 0 (padding) gives 0.
//   ids: [topk]
inline std::int64_t row_keys(const std::int32_t* ids, int topk, std::int32_t p, std::int32_t seq_len) {
  if (p < 0) return 0;
  const std::int64_t limit = std::min<std::int64_t>(p, std::int64_t(seq_len) - 1);
  std::int64_t n = 0;
  for (int k = 0; k < topk; ++k) {
    if (ids[k] < 0) continue;
    const std::int64_t lo = std::int64_t(ids[k]) * kBlockSize;
    const std::int64_t hi = std::min<std::int64_t>(lo + kBlockSize - 1, limit);
    if (hi >= lo) n += hi - lo + 1;
  }
  return n;
}

struct Traffic {
  double flops = 0.0;
  double fp8_flops = 0.0;  // of flops, those on fp8 tensor cores (the e4m3 index prefill's MMAs)
  double bytes = 0.0;
  std::int64_t keys = 0;    // attend: sum over (token, query head); index: over (token, KV head)
  std::int64_t blocks = 0;  // distinct blocks read (attend: per KV head)
};

// Requests are given by query_start [num_requests + 1] and seq_lens [num_requests].
inline std::int32_t token_position(std::int32_t seq_len, std::int32_t query_len, std::int32_t i) {
  return seq_len <= 0 ? -1 : seq_len - query_len + i;
}

// Calls fn(request, kv_head, block) once for every distinct block the step's
// attention reads: the blocks attend_traffic counts, request by request, head
// by head, in order of first selection.
//   topk: [num_tokens, num_kv_heads, topk] token-major
template <class Fn>
void for_each_read_block(const std::vector<std::int32_t>& query_start, const std::vector<std::int32_t>& seq_lens,
                         const std::vector<std::int32_t>& topk_ids, int num_kv_heads, int topk, Fn&& fn) {
  std::vector<std::uint8_t> seen;
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    const std::int32_t blocks = (std::max(seq_lens[r], 0) + kBlockSize - 1) / kBlockSize;
    for (int h = 0; h < num_kv_heads; ++h) {
      seen.assign(std::size_t(blocks), 0);
      for (std::int32_t i = 0; i < qlen; ++i) {
        const std::int32_t* row = topk_ids.data() + (std::int64_t(q0 + i) * num_kv_heads + h) * topk;
        const std::int32_t p = token_position(seq_lens[r], qlen, i);
        if (row_keys(row, topk, p, seq_lens[r]) == 0) continue;
        for (int j = 0; j < topk; ++j) {
          const std::int32_t b = row[j];
          if (b < 0 || b >= blocks || std::int64_t(b) * kBlockSize > p || seen[std::size_t(b)]) continue;
          seen[std::size_t(b)] = 1;
          fn(std::int32_t(r), h, b);
        }
      }
    }
  }
}

//   topk: [num_tokens, num_kv_heads, topk] token-major
inline Traffic attend_traffic(const std::vector<std::int32_t>& query_start,
                              const std::vector<std::int32_t>& seq_lens,
                              const std::vector<std::int32_t>& topk_ids, int num_kv_heads, int group,
                              int topk, std::int64_t block_bytes) {
  Traffic t;
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t q0 = query_start[r], qlen = query_start[r + 1] - q0;
    for (std::int32_t i = 0; i < qlen; ++i)
      for (int h = 0; h < num_kv_heads; ++h)
        t.keys += group * row_keys(topk_ids.data() + (std::int64_t(q0 + i) * num_kv_heads + h) * topk, topk,
                                   token_position(seq_lens[r], qlen, i), seq_lens[r]);
  }
  for_each_read_block(query_start, seq_lens, topk_ids, num_kv_heads, topk,
                      [&](std::int32_t, int, std::int32_t) { ++t.blocks; });
  t.flops = 4.0 * kHeadDim * double(t.keys);
  t.bytes = double(t.blocks) * double(block_bytes);
  return t;
}

// prefill: the rows are scored by the prefill kernel, whose MMAs over an fp8
// cache are e4m3 (the decode kernel widens fp8 keys to fp16).
inline Traffic index_traffic(const std::vector<std::int32_t>& query_start,
                             const std::vector<std::int32_t>& seq_lens, int num_kv_heads,
                             DType index_dtype, bool prefill) {
  Traffic t;
  for (std::size_t r = 0; r + 1 < query_start.size(); ++r) {
    const std::int32_t qlen = query_start[r + 1] - query_start[r];
    if (seq_lens[r] <= 0 || qlen <= 0) continue;
    for (std::int32_t i = 0; i < qlen; ++i)
      t.keys += std::int64_t(token_position(seq_lens[r], qlen, i) + 1) * num_kv_heads;
    t.blocks += (seq_lens[r] + kBlockSize - 1) / kBlockSize;
  }
  t.flops = 2.0 * kHeadDim * double(t.keys);
  if (prefill && index_dtype == DType::fp8_e4m3) t.fp8_flops = t.flops;
  t.bytes = double(t.blocks) * double(index_page_bytes(index_dtype));
  return t;
}

// Bytes of one token's row in the index cache: 256 (bf16), 128 (fp8), 72 (nvfp4).
inline std::int64_t index_row_bytes(DType index_dtype) { return index_page_bytes(index_dtype) / kBlockSize; }

// The insert stage of a layer step: `num_tokens` new tokens, their K and V
// [num_tokens, num_kv_heads, 128] and index keys [num_tokens, 128] read as
// bf16 with their two slot arrays (int64), and written into the KV cache
// (kv_block_bytes / 128 per token and KV head: K + V, and per-token fp8
// scales) and the index cache (index_row_bytes per token). keys = tokens.
inline Traffic insert_traffic(std::int64_t num_tokens, int num_kv_heads, DType kv_dtype, ScaleMode mode,
                              DType index_dtype) {
  Traffic t;
  const double T = double(num_tokens), H = num_kv_heads;
  const double read = T * H * 2 * kHeadDim * 2 + T * kHeadDim * 2 + 2 * T * 8;
  const double written = T * H * double(kv_block_bytes(kv_dtype, mode)) / kBlockSize + T * double(index_row_bytes(index_dtype));
  t.bytes = read + written;
  t.keys = num_tokens;
  return t;
}

// Sum of stage traffics (the layer's totals).
inline Traffic operator+(const Traffic& a, const Traffic& b) {
  return Traffic{a.flops + b.flops, a.fp8_flops + b.fp8_flops, a.bytes + b.bytes, a.keys + b.keys, a.blocks + b.blocks};
}

// Share of each stage in the sum of the stages' times; zeros when the sum is 0.
inline std::vector<double> stage_shares(const std::vector<double>& times) {
  double sum = 0.0;
  for (const double t : times) sum += t;
  std::vector<double> out(times.size(), 0.0);
  if (sum > 0.0)
    for (std::size_t i = 0; i < times.size(); ++i) out[i] = times[i] / sum;
  return out;
}

// ---- rotation of inputs beyond L2 ---------------------------------------------------
// Copies of a case's inputs so that consecutive replays touch different memory
// and the copies together span at least 4x the L2: at least 2, at most
// `max_copies`, and no more than `memory_budget` / `bytes_per_copy`.
inline int rotation_copies(double replay_bytes, double bytes_per_copy, double l2_bytes,
                           double memory_budget, int max_copies = 64) {
  int n = replay_bytes > 0.0 ? int(std::ceil(4.0 * l2_bytes / replay_bytes)) : max_copies;
  n = std::clamp(n, 2, max_copies);
  if (bytes_per_copy > 0.0) n = std::min<int>(n, int(std::max(1.0, std::floor(memory_budget / bytes_per_copy))));
  return std::max(n, 1);
}

// Upper bound of the device bytes one copy of a case's inputs occupies (the
// pages a copy maps, its shared page for unselected blocks included, its top-k
// and block tables), used to size the sweep.
inline double bench_copy_bytes_bound(const BenchCase& c) {
  const double blocks = double((c.seq_len() + kBlockSize - 1) / kBlockSize);
  const double requests = c.batch;
  if (c.op == BenchOp::index) {
    return (requests * blocks + 1.0) * double(index_page_bytes(c.dtype)) + requests * blocks * 4.0;
  }
  if (c.op == BenchOp::layer) {
    // Both caches (the KV one as an attend case maps it), the index table,
    // the top-k lists and the two slot arrays.
    BenchCase index = c, attend = c;
    index.op = BenchOp::index;
    index.dtype = c.index_dtype;
    attend.op = BenchOp::attend;
    return bench_copy_bytes_bound(index) + bench_copy_bytes_bound(attend) + double(c.num_tokens()) * 16.0;
  }
  // Decode: a request maps at most (query_len * topk) blocks per KV head; prefill all of them.
  const double per_request = c.prefill ? blocks : std::min(blocks, double(c.query_len) * c.topk * c.num_kv_heads);
  const double page = double(c.num_kv_heads) * double(kv_block_bytes(c.dtype, ScaleMode::per_tensor));
  return (requests * per_request + 1.0) * page + double(c.num_tokens()) * c.num_kv_heads * c.topk * 4.0 +
         requests * blocks * 4.0;
}

// Device bytes of the parts every copy shares: queries, outputs, the indexer's
// score workspace (an estimate; the attention workspace is asked from the plan).
inline double bench_shared_bytes(const BenchCase& c) {
  const double tokens = double(c.num_tokens());
  const double blocks = double((c.seq_len() + kBlockSize - 1) / kBlockSize);
  const double index = tokens * c.num_kv_heads * (kHeadDim * 2.0 + blocks * 4.0 + c.topk * 4.0);
  const double attend = tokens * c.num_q_heads * (kHeadDim * 2.0 * 2.0 + 4.0);
  if (c.op == BenchOp::index) return index;
  if (c.op == BenchOp::attend) return attend;
  // The layer also holds the new tokens' K, V and index keys.
  return index + attend + tokens * (c.num_kv_heads * 2.0 + 1.0) * kHeadDim * 2.0;
}

// ---- timing summary ----------------------------------------------------------------
struct TimeStats {
  double median_us = 0.0;
  double min_us = 0.0;
  double mean_us = 0.0;
  double p90_us = 0.0;
  int samples = 0;
};

inline TimeStats summarize_ms(std::vector<float> ms) {
  TimeStats s;
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  s.samples = int(n);
  s.min_us = 1e3 * ms.front();
  s.median_us = 1e3 * (n % 2 ? ms[n / 2] : 0.5 * (double(ms[n / 2 - 1]) + ms[n / 2]));
  double sum = 0.0;
  for (const float x : ms) sum += x;
  s.mean_us = 1e3 * sum / double(n);
  s.p90_us = 1e3 * ms[std::min(n - 1, std::size_t(std::ceil(0.9 * double(n))) - 1)];
  return s;
}

}  // namespace msa::tool
