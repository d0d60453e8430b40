// The case list of `msa check`: a pure function of (seed, count) so that every
// failing case can be replayed with `msa check --seed S --case N`, and so that
// the coverage of the list is unit-tested on the CPU (test_bench_accounting).
//
// Every dimension (KV flavor, layout, GQA group, top-k, batch kind, query dtype,
// index dtype, prefill order) walks through all its values once per "round" of cases, in an
// order shuffled per round, so any `size` consecutive cases cover all `size`
// values of a dimension while the combinations still vary. An fp8 index cache
// reads an e4m3 index query in about half of its cases (a cycled dimension of its own).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "msa/cache.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"
#include "rng.hpp"

namespace msa::tool {

enum class BatchKind : std::uint8_t { decode, verify, prefill, mixed };

inline const char* batch_kind_name(BatchKind k) {
  switch (k) {
    case BatchKind::decode: return "decode";
    case BatchKind::verify: return "verify";
    case BatchKind::prefill: return "prefill";
    case BatchKind::mixed: return "mixed";
  }
  return "unknown";
}

struct KvFlavor {
  DType dtype;
  ScaleMode scale_mode;
};

// The seven KV cache flavors the check covers.
inline std::vector<KvFlavor> kv_flavors() {
  return {{DType::bf16, ScaleMode::none},
          {DType::fp16, ScaleMode::none},
          {DType::fp8_e4m3, ScaleMode::per_tensor},
          {DType::fp8_e4m3, ScaleMode::per_token_head},
          {DType::fp8_e5m2, ScaleMode::per_tensor},
          {DType::fp8_e5m2, ScaleMode::per_token_head},
          {DType::nvfp4, ScaleMode::per_tensor}};
}

inline std::string kv_flavor_name(DType dtype, ScaleMode mode) {
  std::string s = dtype_name(dtype);
  if (is_fp8(dtype)) s += mode == ScaleMode::per_token_head ? "/token" : "/tensor";
  return s;
}

struct CheckCase {
  int index = 0;
  std::uint64_t seed = 0;  // seed of this case's data
  DType kv_dtype = DType::bf16;
  ScaleMode scale_mode = ScaleMode::none;
  Layout layout = Layout::hnd;  // ignored by nvfp4 (head-slot pages)
  bool padded_stride = false;   // page stride of 3 pages (layer-outer packing), view on layer 1
  int num_kv_heads = 1;
  int group = 1;
  int topk = 16;
  DType q_dtype = DType::bf16;    // bf16, fp16 or fp8_e4m3
  DType out_dtype = DType::bf16;  // bf16 or fp16
  DType src_dtype = DType::bf16;  // K/V/index-key insert source and index-query dtype
  DType index_dtype = DType::bf16;  // bf16, fp8_e4m3 or nvfp4
  bool fp8_index_query = false;   // fp8_e4m3 index: the index query cast to e4m3 (iq_dtype fp8_e4m3)
  bool own_index_table = false;   // index cache has its own pages and block table
  bool shuffle_topk = false;      // attend reads the valid entries in random order
  bool key_major = false;         // the plan asks for key-major prefill (PrefillOrder::key_major)
  BatchKind kind = BatchKind::decode;
  int decode_threshold = 1;
  std::vector<std::int32_t> query_lens;  // [num_requests]
  std::vector<std::int32_t> seq_lens;    // [num_requests], 0 = padding request

  int num_q_heads() const { return num_kv_heads * group; }
  DType iq_dtype() const { return fp8_index_query ? DType::fp8_e4m3 : src_dtype; }
  std::int64_t num_tokens() const {
    std::int64_t n = 0;
    for (const auto q : query_lens) n += q;
    return n;
  }
  bool fp8_math() const { return !is_half(kv_dtype) || q_dtype == DType::fp8_e4m3; }
  // Bound on the relative Frobenius error of each token's output row (contract 9).
  double attend_bound() const { return fp8_math() ? 2e-2 : 1e-2; }

  std::string name() const {
    std::string s = "#" + std::to_string(index) + " " + kv_flavor_name(kv_dtype, scale_mode) + " ";
    s += kv_dtype == DType::nvfp4 ? std::string("slots") : std::string(layout_name(layout));
    if (padded_stride) s += "+pad";
    s += " H" + std::to_string(num_kv_heads) + "xg" + std::to_string(group) + " k" + std::to_string(topk);
    s += " q=" + std::string(dtype_name(q_dtype));
    if (q_dtype != out_dtype) s += ">" + std::string(dtype_name(out_dtype));
    s += " idx=" + std::string(dtype_name(index_dtype));
    if (fp8_index_query) s += "/q8";
    if (own_index_table) s += "/own";
    if (shuffle_topk) s += " shuf";
    if (key_major) s += " km";
    s += " " + std::string(batch_kind_name(kind)) + " [";
    for (std::size_t r = 0; r < query_lens.size(); ++r) {
      if (r) s += " ";
      s += std::to_string(query_lens[r]) + "/" + std::to_string(seq_lens[r]);
    }
    return s + "]";
  }
};

// Work of the CPU reference for a case, in (key x query head) pairs: the
// attention (min(p + 1, topk * 128) keys per query head) plus half the indexer
// (p + 1 keys per KV head, half the flops per key).
inline double reference_work(const CheckCase& c) {
  double work = 0.0;
  for (std::size_t r = 0; r < c.query_lens.size(); ++r) {
    if (c.seq_lens[r] <= 0) continue;
    for (std::int32_t i = 0; i < c.query_lens[r]; ++i) {
      const double p = double(c.seq_lens[r] - c.query_lens[r] + i);
      work += std::min(p + 1.0, double(c.topk) * kBlockSize) * c.num_q_heads();
      work += 0.5 * (p + 1.0) * c.num_kv_heads;
    }
  }
  return work;
}

namespace detail {

// Value of dimension `dim` for case i: a permutation of [0, size) per round.
inline int cycled(std::uint64_t seed, int dim, int size, int i) {
  Rng r(seed ^ mix64(std::uint64_t(dim) * 1000003ull + std::uint64_t(i / size)));
  std::vector<int> p(std::size_t(size), 0);
  std::iota(p.begin(), p.end(), 0);
  r.shuffle(p);
  return p[std::size_t(i % size)];
}

// Sequence lengths the check must meet (contexts 1, 127, 129, 2047, 2049, 10K+).
inline std::int32_t odd_length(Rng& rng, int which) {
  static constexpr std::int32_t kOdd[] = {1, 127, 129, 2047, 2049};
  if (which < 5) return kOdd[which];
  return std::int32_t(rng.between(10000, 13000));
}

// Keeps the CPU reference work under `budget` by halving the longest prefill
// (never below `min_prefill_len`), then dropping trailing requests.
inline void fit_budget(CheckCase& c, double budget, std::int32_t min_prefill_len) {
  for (int guard = 0; guard < 64 && reference_work(c) > budget; ++guard) {
    std::size_t longest = c.query_lens.size();
    for (std::size_t r = 0; r < c.query_lens.size(); ++r) {
      const bool prefill = c.query_lens[r] > c.decode_threshold;
      if (prefill && c.query_lens[r] / 2 >= min_prefill_len &&
          (longest == c.query_lens.size() || c.query_lens[r] > c.query_lens[longest]))
        longest = r;
    }
    if (longest < c.query_lens.size()) {
      const std::int32_t cut = c.query_lens[longest] / 2;
      c.query_lens[longest] -= cut;
      c.seq_lens[longest] -= cut;
    } else if (c.query_lens.size() > 1) {
      c.query_lens.pop_back();
      c.seq_lens.pop_back();
    } else {
      break;
    }
  }
}

inline void make_requests(CheckCase& c, Rng& rng, int start, bool quick) {
  const int max_decodes = quick ? 3 : 6;
  auto add_decodes = [&](int n, std::int32_t qlen) {
    for (int k = 0; k < n; ++k) {
      const std::int32_t seq = odd_length(rng, (start + k) % 6);
      c.query_lens.push_back(qlen);
      c.seq_lens.push_back(std::max(seq, qlen));
    }
    // A padding request (seq_len 0) among the decodes, as CUDA-graph batches have.
    if (rng.chance(0.3)) {
      const auto at = std::size_t(rng.between(0, std::int64_t(c.query_lens.size())));
      c.query_lens.insert(c.query_lens.begin() + std::ptrdiff_t(at), qlen);
      c.seq_lens.insert(c.seq_lens.begin() + std::ptrdiff_t(at), 0);
    }
  };
  auto add_prefills = [&](int n, std::int32_t min_len) {
    static constexpr std::int32_t kLens[] = {1, 2, 63, 127, 128, 129, 300, 2049};
    for (int k = 0; k < n; ++k) {
      std::int32_t q = kLens[rng.between(0, quick ? 6 : 7)];
      q = std::max(q, min_len);
      const int which = (start + 3 + k) % 7;  // 6 = no cached context
      const std::int32_t context = which == 6 ? 0 : odd_length(rng, which);
      c.query_lens.push_back(q);
      c.seq_lens.push_back(context + q);
    }
  };
  switch (c.kind) {
    case BatchKind::decode:
      c.decode_threshold = 1;
      add_decodes(int(rng.between(1, max_decodes)), 1);
      break;
    case BatchKind::verify: {
      const auto q = std::int32_t(rng.between(2, 4));
      c.decode_threshold = q;
      add_decodes(int(rng.between(1, max_decodes)), q);
      break;
    }
    case BatchKind::prefill:
      c.decode_threshold = 0;  // one-token chunks are prefills too
      add_prefills(int(rng.between(1, 3)), 1);
      break;
    case BatchKind::mixed: {
      static constexpr std::int32_t kDecodeLens[] = {1, 2, 4};
      const std::int32_t q = kDecodeLens[rng.between(0, 2)];
      c.decode_threshold = q;
      add_decodes(int(rng.between(1, 4)), q);
      add_prefills(int(rng.between(1, 2)), q + 1);
      break;
    }
  }
  fit_budget(c, quick ? 4e6 : 3e7, c.decode_threshold + 1);
}

}  // namespace detail

// Case i with i % kKeyMajorEvery == kKeyMajorEvery - 1 is a key-major prefill step.
inline constexpr int kKeyMajorEvery = 14;

// The first `count` cases of the list for `seed`. `quick` keeps the sizes small.
inline std::vector<CheckCase> make_check_cases(std::uint64_t seed, int count, bool quick) {
  MSA_CHECK(count >= 0, "cases = ", count, " must be >= 0");
  static constexpr int kGroups[] = {1, 2, 8, 16};
  static constexpr int kTopks[] = {1, 16, 64};
  static constexpr Layout kLayouts[] = {Layout::hnd, Layout::nhd, Layout::split};
  static constexpr DType kQ[] = {DType::bf16, DType::fp16, DType::fp8_e4m3};
  const std::vector<KvFlavor> flavors = kv_flavors();
  std::vector<CheckCase> cases;
  for (int i = 0; i < count; ++i) {
    CheckCase c;
    c.index = i;
    c.seed = mix64(seed * 0x100000001B3ull + std::uint64_t(i));
    Rng rng(c.seed);
    const KvFlavor f = flavors[std::size_t(detail::cycled(seed, 0, 7, i))];
    c.kv_dtype = f.dtype;
    c.scale_mode = f.scale_mode;
    const int lay = detail::cycled(seed, 1, 6, i);
    c.layout = kLayouts[lay % 3];
    c.padded_stride = lay >= 3;
    c.group = kGroups[detail::cycled(seed, 2, 4, i)];
    c.topk = kTopks[detail::cycled(seed, 3, 3, i)];
    c.kind = static_cast<BatchKind>(detail::cycled(seed, 4, 4, i));
    c.num_kv_heads = int(rng.between(1, quick ? 2 : 4));
    c.q_dtype = kQ[detail::cycled(seed, 5, 3, i)];
    // A bf16 or fp16 cache is read with a query of its own dtype (or fp8).
    if (is_half(c.kv_dtype) && is_half(c.q_dtype)) c.q_dtype = c.kv_dtype;
    c.out_dtype = is_half(c.q_dtype) ? c.q_dtype : (rng.chance(0.5) ? DType::bf16 : DType::fp16);
    static constexpr DType kIndex[] = {DType::bf16, DType::fp8_e4m3, DType::nvfp4};
    c.index_dtype = kIndex[detail::cycled(seed, 6, 3, i)];
    // Half of the fp8 index cases read an e4m3 index query (cast like the keys).
    c.fp8_index_query = c.index_dtype == DType::fp8_e4m3 && detail::cycled(seed, 8, 2, i) == 1;
    c.src_dtype = rng.chance(0.5) ? DType::bf16 : DType::fp16;
    c.own_index_table = rng.chance(0.5);
    c.shuffle_topk = rng.chance(0.3);
    // (It changes only prefill-only steps on bf16 / fp16 caches whose tiles are 128 rows.)
    c.key_major = detail::cycled(seed, 7, 2, i) == 1;
    // Every 14th case (the last of --quick's 14) is a key-major prefill step on
    // a 16-bit cache with 128-row tiles (G 16, top-k 16), so that every list of
    // 14 or more reaches the key-major kernel and its merge.
    if (i % kKeyMajorEvery == kKeyMajorEvery - 1) {
      c.kind = BatchKind::prefill;
      c.kv_dtype = rng.chance(0.5) ? DType::bf16 : DType::fp16;
      c.scale_mode = ScaleMode::none;
      c.group = 16;
      c.topk = 16;
      c.q_dtype = c.out_dtype = c.kv_dtype;
      c.key_major = true;
    }
    detail::make_requests(c, rng, i, quick);
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace msa::tool
