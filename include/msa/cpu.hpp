// The CPU engine: every operation of the MSA contract, multithreaded over the
// machine's cores. It is also the reference the CUDA backend is checked against.
#pragma once

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/dtype.hpp"
#include "msa/ops.hpp"
#include "msa/pre_attention.hpp"

namespace msa::cpu {

struct Options {
  int num_threads = 0;  // 0: one per hardware thread; at most 1024 (msa::Error beyond)
  // Scan the index data before touching memory: block-table entries, top-k
  // ids and slots, each reported by name. With false, an out-of-range id,
  // page or slot is skipped and never dereferenced (its block holds no keys,
  // its token is not written). The views, the step and a k2q plan are checked
  // either way (that costs no pass over the index data).
  bool check = true;
};

// Writes K and V of each token with slot >= 0 into the cache, quantizing as the
// cache dtype asks (fp8 per-tensor or per-(token, head) scales, nvfp4 groups).
// In per_token_head mode the scales are computed here (amax / fp8 max, 1 when
// amax is 0) and written to cache.k_scales / cache.v_scales.
void insert_kv(const KVCacheView& cache, const InsertKVArgs& args, const Options& opt = {});

// Writes each token's index key: bf16; fp8 e4m3 by a plain saturating cast; or
// nvfp4, quantized like the nvfp4 KV cache under cache.global_scale (contract 4.2).
void insert_index(const IndexCacheView& cache, const InsertIndexArgs& args, const Options& opt = {});

// Pre-attention (msa/pre_attention.hpp): Q/K norm and partial RoPE of the qkv
// rows, q and index q into their buffers, K and V into `cache` and the index
// key into `index_cache` through cpu::insert_kv / insert_index. Without
// opt.check a token whose position is outside the cos/sin table is skipped
// whole (nothing of it is written) and bad slots are skipped.
void pre_attention(const KVCacheView& cache, const IndexCacheView& index_cache,
                   const PreAttentionArgs& args, const Options& opt = {});

// The index query of an fp8_e4m3 index cache: each bf16 / fp16 value cast to
// fp8 e4m3 by the plain saturating cast insert_index applies to the keys
// (round to nearest even, beyond +-448 to +-448, NaN to NaN, no scale;
// contract 3). Pass the result as index_q with iq_dtype fp8_e4m3.
//   src: [n] src_dtype (bf16 or fp16), dst: [n] e4m3
void cast_index_query_e4m3(const void* src, DType src_dtype, std::int64_t n, void* dst,
                           const Options& opt = {});

// Block scores: scores[t, h, b] = max over visible tokens j of block b (j <= p)
// of dot(index_q[t, h], index_k[j]) in fp32; -inf for b > p / 128.
//   scores: [num_tokens, num_kv_heads, max_blocks]
void block_scores(const StepView& step, const IndexerArgs& args, float* scores,
                  std::int32_t max_blocks, const Options& opt = {});

// Top-k of one row from its scores (forced blocks, ties to the lower id, NaN
// lowest, ascending ids, then -1).
//   scores: [last + 1], out: [topk]
void select_row(const float* scores, std::int32_t last, std::int32_t topk, std::int32_t init_blocks,
                std::int32_t local_blocks, std::int32_t* out);

// block_scores then select_row for every (token, KV head). Rows of padding
// requests get -1 everywhere.
void index(const StepView& step, const IndexerArgs& args, const Options& opt = {});

// Sparse attention of every token of the step (decode, verify and prefill alike).
void attend(const StepView& step, const AttentionArgs& args, const Options& opt = {});

}  // namespace msa::cpu
