// The case lists of `msa bench --set` (pure host functions, unit-tested in
// tests/unit/test_bench_accounting.cpp): default, quick, production, index,
// layer (and its quick variant), peers, overlap and ranks. bench/README.md
// describes each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_accounting.hpp"
#include "bench_pre_attention.hpp"
#include "msa/dtype.hpp"
#include "msa/error.hpp"

namespace msa::tool {

inline constexpr std::int32_t kPrefillChunk = 4096;
inline constexpr std::int32_t kLongPrefillChunk = 32768;

// The default sweep: MiniMax-M3 per-rank shapes 16/1 (TP4) and 64/4 (TP1);
// attend over KV bf16, fp8 e4m3 (per-tensor scale) and nvfp4; prefill chunks of
// 4096 and 32768 tokens; decode batches 1, 8, 32, 64, 128 at query lengths 1, 2, 4; contexts 8K..128K.
inline std::vector<BenchCase> default_bench_cases() {
  static constexpr int kShapes[][2] = {{16, 1}, {64, 4}};
  static constexpr DType kKv[] = {DType::bf16, DType::fp8_e4m3, DType::nvfp4};
  static constexpr std::int32_t kContexts[] = {8192, 32768, 131072};
  static constexpr std::int32_t kBatches[] = {1, 8, 32, 64, 128};
  static constexpr std::int32_t kQueryLens[] = {1, 2, 4};
  std::vector<BenchCase> out;
  for (const BenchOp op : {BenchOp::attend, BenchOp::index}) {
    for (const auto& shape : kShapes) {
      for (const DType dt : kKv) {
        if (op == BenchOp::index && dt != DType::bf16) continue;  // index cache: bf16
        BenchCase c;
        c.op = op;
        c.num_q_heads = shape[0];
        c.num_kv_heads = shape[1];
        c.dtype = dt;
        for (const std::int32_t ctx : kContexts) {
          c.context = ctx;
          c.prefill = true;
          c.batch = 1;
          for (const std::int32_t chunk : {kPrefillChunk, kLongPrefillChunk}) {
            c.query_len = chunk;
            out.push_back(c);
          }
          c.prefill = false;
          for (const std::int32_t b : kBatches) {
            for (const std::int32_t q : kQueryLens) {
              c.batch = b;
              c.query_len = q;
              out.push_back(c);
            }
          }
        }
      }
    }
  }
  return out;
}

// About a dozen cases that run in well under two minutes.
inline std::vector<BenchCase> quick_bench_cases() {
  const auto make = make_bench_case;
  const BenchOp A = BenchOp::attend, I = BenchOp::index;
  return {make(A, false, 16, 1, DType::bf16, 8192, 1, 1),
          make(A, false, 16, 1, DType::bf16, 32768, 32, 1),
          make(A, true, 16, 1, DType::bf16, 32768, 1, kLongPrefillChunk),
          make(A, false, 64, 4, DType::bf16, 32768, 32, 1),
          make(A, false, 64, 4, DType::fp8_e4m3, 32768, 32, 1),
          make(A, false, 64, 4, DType::nvfp4, 32768, 32, 1),
          make(A, false, 64, 4, DType::bf16, 131072, 128, 1),
          make(A, false, 16, 1, DType::bf16, 131072, 128, 4),
          make(A, true, 64, 4, DType::bf16, 32768, 1, kPrefillChunk),
          make(A, true, 16, 1, DType::fp8_e4m3, 131072, 1, kPrefillChunk),
          make(I, false, 64, 4, DType::bf16, 131072, 32, 1),
          make(I, true, 64, 4, DType::bf16, 32768, 1, kPrefillChunk)};
}

// The production chunked-prefill set (record-prefill work): steps of `batch`
// requests, each a chunk of q new tokens on `ctx` cached ones. Small chunks
// (256, as the 150-350-token chunks of a busy server) come with batches up to
// 10, 1.5K chunks likewise, 16K chunks with 1 or 2 requests.
struct PrefillStep {
  std::int32_t chunk, context, batch;
};
inline constexpr std::int32_t k17K = 17 * 1024, k64K = 64 * 1024, k170K = 170 * 1024;
// Every step: attend over bf16 KV on both shapes.
inline constexpr PrefillStep kProductionSteps[] = {
    {256, k64K, 1},    {256, k64K, 4},    {256, k64K, 10},    {256, k17K, 10},    {256, k170K, 10},
    {1536, k64K, 1},   {1536, k64K, 4},   {1536, k64K, 10},   {1536, k17K, 4},    {1536, k170K, 4},
    {16384, k17K, 1},  {16384, k64K, 1},  {16384, k170K, 1},  {16384, k170K, 2}};
// One step per chunk size: attend over fp8_e4m3 KV and the indexer, both shapes.
inline constexpr PrefillStep kProductionReps[] = {{256, k64K, 10}, {1536, k64K, 4}, {16384, k170K, 1}};

inline std::vector<BenchCase> production_bench_cases() {
  static constexpr int kShapes[][2] = {{16, 1}, {64, 4}};
  std::vector<BenchCase> out;
  auto add = [&](BenchOp op, DType dt, const auto& steps) {
    for (const auto& shape : kShapes)
      for (const PrefillStep& s : steps)
        out.push_back(make_bench_case(op, true, shape[0], shape[1], dt, s.context, s.batch, s.chunk));
  };
  add(BenchOp::attend, DType::bf16, kProductionSteps);
  add(BenchOp::attend, DType::fp8_e4m3, kProductionReps);
  add(BenchOp::index, DType::bf16, kProductionReps);
  return out;
}

// The indexer set: decode / verify on both shapes at 32K and 128K, batches
// 1-128, and the production prefill steps, over bf16, fp8 e4m3 (with an fp8
// query) and nvfp4 index caches.
inline std::vector<BenchCase> index_bench_cases() {
  static constexpr int kShapes[][2] = {{16, 1}, {64, 4}};
  std::vector<BenchCase> out;
  for (const DType dt : {DType::bf16, DType::fp8_e4m3, DType::nvfp4}) {
    for (const auto& shape : kShapes) {
      for (const std::int32_t ctx : {32768, 131072})
        for (const std::int32_t b : {1, 8, 32, 128})
          for (const std::int32_t q : {1, 4})
            out.push_back(make_bench_case(BenchOp::index, false, shape[0], shape[1], dt, ctx, b, q));
      for (const PrefillStep& st : kProductionReps)
        out.push_back(make_bench_case(BenchOp::index, true, shape[0], shape[1], dt, st.context, st.batch, st.chunk));
    }
  }
  return out;
}

inline constexpr std::int32_t k32K = 32 * 1024, k128K = 128 * 1024;
inline constexpr std::int32_t kDecodeBatches[] = {1, 8, 32, 64, 128};

inline BenchCase make_layer_case(bool prefill, int qh, int kvh, DType kv, DType index, std::int32_t ctx,
                                 std::int32_t batch, std::int32_t query_len) {
  BenchCase c = make_bench_case(BenchOp::layer, prefill, qh, kvh, kv, ctx, batch, query_len);
  c.index_dtype = index;
  return c;
}

// The layer set: one engine step of one sparse layer (insert + index + attend).
//  - decode and verify (q 1, 2, 4) at batches 1-128, contexts 32K and 128K,
//    both shapes: KV bf16, index bf16;
//  - index fp8_e4m3 (fp8 query) and nvfp4: decode at every batch and context,
//    verify q = 4 at batches 8 and 128 on 128K, both shapes;
//  - the production prefill steps of kProductionReps, both shapes, every index dtype;
//  - KV fp8_e4m3: decode b = 128 on 128K and the 16K-token chunk, both shapes,
//    index bf16 and nvfp4.
inline std::vector<BenchCase> layer_bench_cases() {
  static constexpr int kShapes[][2] = {{16, 1}, {64, 4}};
  static constexpr DType kLowIndex[] = {DType::fp8_e4m3, DType::nvfp4};
  const DType bf16 = DType::bf16;
  std::vector<BenchCase> out;
  for (const auto& sh : kShapes)
    for (const std::int32_t ctx : {k32K, k128K})
      for (const std::int32_t q : {1, 2, 4})
        for (const std::int32_t b : kDecodeBatches) out.push_back(make_layer_case(false, sh[0], sh[1], bf16, bf16, ctx, b, q));
  for (const DType index : kLowIndex) {
    for (const auto& sh : kShapes) {
      for (const std::int32_t ctx : {k32K, k128K})
        for (const std::int32_t b : kDecodeBatches) out.push_back(make_layer_case(false, sh[0], sh[1], bf16, index, ctx, b, 1));
      for (const std::int32_t b : {8, 128}) out.push_back(make_layer_case(false, sh[0], sh[1], bf16, index, k128K, b, 4));
    }
  }
  for (const DType index : {DType::bf16, DType::fp8_e4m3, DType::nvfp4})
    for (const auto& sh : kShapes)
      for (const PrefillStep& s : kProductionReps)
        out.push_back(make_layer_case(true, sh[0], sh[1], bf16, index, s.context, s.batch, s.chunk));
  for (const DType index : {DType::bf16, DType::nvfp4}) {
    for (const auto& sh : kShapes) {
      out.push_back(make_layer_case(false, sh[0], sh[1], DType::fp8_e4m3, index, k128K, 128, 1));
      out.push_back(make_layer_case(true, sh[0], sh[1], DType::fp8_e4m3, index, k170K, 1, 16384));
    }
  }
  return out;
}

// A quarter-minute of layer cases (`--set layer --quick`): the largest decode
// step at every index dtype, a small decode, a verify, the 16K and 256-token
// prefill steps, one fp8 KV cache.
inline std::vector<BenchCase> layer_quick_bench_cases() {
  const DType bf16 = DType::bf16, fp8 = DType::fp8_e4m3, fp4 = DType::nvfp4;
  const auto L = make_layer_case;
  std::vector<BenchCase> out;
  for (const DType index : {bf16, fp8, fp4}) {
    out.push_back(L(false, 16, 1, bf16, index, k128K, 128, 1));
    out.push_back(L(false, 64, 4, bf16, index, k128K, 128, 1));
  }
  out.push_back(L(false, 16, 1, bf16, bf16, k32K, 8, 1));
  out.push_back(L(false, 64, 4, bf16, bf16, k128K, 1, 1));
  out.push_back(L(false, 16, 1, bf16, bf16, k128K, 32, 4));
  out.push_back(L(true, 16, 1, bf16, bf16, k170K, 1, 16384));
  out.push_back(L(true, 64, 4, bf16, bf16, k170K, 1, 16384));
  out.push_back(L(true, 16, 1, bf16, fp4, k170K, 1, 16384));
  out.push_back(L(true, 16, 1, bf16, bf16, k64K, 10, 256));
  out.push_back(L(false, 64, 4, fp8, bf16, k128K, 128, 1));
  return out;
}

// The peers set: the attention cases compared with other implementations, per
// KV dtype (fp8_e4m3 first, then bf16 and nvfp4):
//  - prefill 16/1 ctx=32K q=4096, 64/4 ctx=32K q=4096, 16/1 ctx=128K q=4096,
//    16/1 ctx=32K q=32768 (one request), each random and clustered;
//  - the production steps of kProductionReps on both shapes, clustered;
//  - decode 16/1 and 64/4 at batches 1-128, contexts 32K and 128K;
//  - verify q = 4 at batches 32 and 128, both shapes, contexts 32K and 128K.
// Decode and verify take the run's pattern (--pattern).
inline std::vector<BenchCase> peers_bench_cases() {
  static constexpr int kShapes[][2] = {{16, 1}, {64, 4}};
  struct Prefill {
    int qh, kvh;
    std::int32_t context, chunk;
  };
  static constexpr Prefill kPrefills[] = {
      {16, 1, k32K, kPrefillChunk}, {64, 4, k32K, kPrefillChunk}, {16, 1, k128K, kPrefillChunk}, {16, 1, k32K, kLongPrefillChunk}};
  const BenchOp A = BenchOp::attend;
  std::vector<BenchCase> out;
  for (const DType kv : {DType::fp8_e4m3, DType::bf16, DType::nvfp4}) {
    for (const Prefill& p : kPrefills) {
      for (const TopkPattern pattern : {TopkPattern::random, TopkPattern::clustered}) {
        BenchCase c = make_bench_case(A, true, p.qh, p.kvh, kv, p.context, 1, p.chunk);
        c.pattern = pattern;
        out.push_back(c);
      }
    }
    for (const auto& sh : kShapes) {
      for (const PrefillStep& s : kProductionReps) {
        BenchCase c = make_bench_case(A, true, sh[0], sh[1], kv, s.context, s.batch, s.chunk);
        c.pattern = TopkPattern::clustered;
        out.push_back(c);
      }
    }
    for (const auto& sh : kShapes)
      for (const std::int32_t ctx : {k32K, k128K})
        for (const std::int32_t b : kDecodeBatches) out.push_back(make_bench_case(A, false, sh[0], sh[1], kv, ctx, b, 1));
    for (const auto& sh : kShapes)
      for (const std::int32_t ctx : {k32K, k128K})
        for (const std::int32_t b : {32, 128}) out.push_back(make_bench_case(A, false, sh[0], sh[1], kv, ctx, b, 4));
  }
  return out;
}

// The overlap set: the peers' random-prefill shapes (16/1 ctx=32K q=4096,
// 64/4 ctx=32K q=4096, 16/1 ctx=32K q=32768), bf16 and fp8 e4m3 KV, each
// random, partial with 0.2-0.9 of a token's ids shared, and clustered: how
// each prefill order's time follows the overlap of neighbouring tokens'
// selections, and where query-major and key-major cross (run it with
// --prefill query-major, key-major and auto).
inline constexpr double kOverlapShares[] = {0.2, 0.4, 0.6, 0.7, 0.8, 0.9};
inline std::vector<BenchCase> overlap_bench_cases() {
  struct Prefill {
    int qh, kvh;
    std::int32_t chunk;
  };
  static constexpr Prefill kPrefills[] = {{16, 1, kPrefillChunk}, {64, 4, kPrefillChunk}, {16, 1, kLongPrefillChunk}};
  std::vector<BenchCase> out;
  for (const DType kv : {DType::bf16, DType::fp8_e4m3}) {
    for (const Prefill& p : kPrefills) {
      BenchCase c = make_bench_case(BenchOp::attend, true, p.qh, p.kvh, kv, k32K, 1, p.chunk);
      c.pattern = TopkPattern::random;
      out.push_back(c);
      c.pattern = TopkPattern::partial;
      for (const double shared : kOverlapShares) {
        c.shared = shared;
        out.push_back(c);
      }
      c.pattern = TopkPattern::clustered;
      c.shared = 0.5;
      out.push_back(c);
    }
  }
  return out;
}

// The ranks set: the per-rank shapes the other sets leave out, TP2 (32/2) and
// TP8 (8/1, the rank's one KV head replicated), so that a user of either reads
// its own numbers. Per shape:
//  - attend over bf16, fp8 e4m3 and nvfp4 KV: the production steps of
//    kProductionReps (clustered), prefill ctx=32K q=4096 random, decode
//    ctx=32K at batches 1, 8, 32 and 128, verify q = 4 at batch 32;
//  - the indexer over a bf16 index cache: decode ctx=32K at batches 8 and 128,
//    the 1.5K-token production step;
//  - pre-attention at 1, 4096 and 32768 tokens over bf16, fp8 e4m3 and nvfp4 KV.
inline std::vector<BenchCase> ranks_bench_cases() {
  static constexpr int kShapes[][2] = {{32, 2}, {8, 1}};
  static constexpr DType kKv[] = {DType::bf16, DType::fp8_e4m3, DType::nvfp4};
  const BenchOp A = BenchOp::attend, I = BenchOp::index;
  std::vector<BenchCase> out;
  for (const auto& sh : kShapes) {
    const int qh = sh[0], kvh = sh[1];
    for (const DType kv : kKv) {
      for (const PrefillStep& s : kProductionReps) {
        BenchCase c = make_bench_case(A, true, qh, kvh, kv, s.context, s.batch, s.chunk);
        c.pattern = TopkPattern::clustered;
        out.push_back(c);
      }
      BenchCase r = make_bench_case(A, true, qh, kvh, kv, k32K, 1, kPrefillChunk);
      r.pattern = TopkPattern::random;
      out.push_back(r);
      for (const std::int32_t b : {1, 8, 32, 128}) out.push_back(make_bench_case(A, false, qh, kvh, kv, k32K, b, 1));
      out.push_back(make_bench_case(A, false, qh, kvh, kv, k32K, 32, 4));
    }
    for (const std::int32_t b : {8, 128}) out.push_back(make_bench_case(I, false, qh, kvh, DType::bf16, k32K, b, 1));
    out.push_back(make_bench_case(I, true, qh, kvh, DType::bf16, k64K, 4, 1536));
    for (const DType kv : kKv)
      for (const std::int32_t n : {1, 4096, 32768})
        out.push_back(make_bench_case(BenchOp::pre_attention, false, qh, kvh, kv, 0, n, 1));
  }
  return out;
}

// The case set named by `msa bench --set` (with --quick: the set's quick
// variant; `quick` alone is the default set's).
inline std::vector<BenchCase> bench_case_set(const std::string& set, bool quick = false) {
  if (quick && (set == "default" || set == "quick")) return quick_bench_cases();
  if (quick && set == "layer") return layer_quick_bench_cases();
  MSA_CHECK(!quick, "--quick with --set = '", set, "': only the default and layer sets have a quick variant");
  if (set == "default") return default_bench_cases();
  if (set == "quick") return quick_bench_cases();
  if (set == "production") return production_bench_cases();
  if (set == "index") return index_bench_cases();
  if (set == "layer") return layer_bench_cases();
  if (set == "peers") return peers_bench_cases();
  if (set == "overlap") return overlap_bench_cases();
  if (set == "pre_attention") return pre_attention_bench_cases();
  if (set == "ranks") return ranks_bench_cases();
  fail("--set = '", set,
       "' but the case sets are default, quick, production, index, layer, peers, overlap, pre_attention and ranks");
}

}  // namespace msa::tool
