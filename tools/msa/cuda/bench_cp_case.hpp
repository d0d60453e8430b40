// One rank of a `msa bench-cp` case: the cases, the sharding, and what a rank
// holds on its GPU (bench_cp_case.cpp).
//
// Every request of a case has `context` cached tokens and `query_len` new ones
// (BenchCase, bench_accounting.hpp; the KV cache and the index cache are bf16).
// Rank r of N holds only the blocks it owns (msa::cp::Sharding): its caches
// have one page per owned (request, block), in request-then-block order, and
// its block table -1 for every other block (one table serves both caches). The
// contents of block b of request q are a function of (seed, q, b) alone, so
// every N sees the same keys and values, the same index keys, the same top-k
// and (up to rounding) the same output: the bench compares them with N = 1.
// Queries and index queries are the same on every rank (the same seeds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_accounting.hpp"
#include "device_memory.hpp"
#include "msa/batch.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/ops.hpp"

namespace msa::tool {

inline constexpr std::int32_t kCpDecodeContext = 1 << 20;   // 1,048,576 cached tokens
inline constexpr std::int32_t kCpDecodeBatch = 4;
inline constexpr std::int32_t kCpPrefillContext = 1 << 18;  // 262,144 cached tokens
inline constexpr std::int32_t kCpPrefillChunk = 1 << 14;    // 16,384 new tokens

// Decodes (q = 1 and 2) of 4 requests on a 1M context and one 16K prefill chunk
// on a 256K context, for the shapes 16/1 and 64/4.
std::vector<BenchCase> default_cp_cases();
// One decode (64/4, q = 1) and one prefill (16/1).
std::vector<BenchCase> quick_cp_cases();
// The case's name without the op word, e.g. "decode 64/4 bf16 ctx=1024K b=4 q=1".
std::string cp_case_name(const BenchCase& c);
// Blocks of each request: ceil(seq_len / 128).
std::int32_t cp_case_blocks(const BenchCase& c);

// Sharding of a case over `ranks` ranks: run_blocks 0 is round-robin, > 0 runs
// of that many blocks, < 0 even runs of ceil(blocks / ranks).
cp::Sharding cp_sharding(const BenchCase& c, int ranks, int run_blocks);
// Words for a sharding, e.g. "round-robin" or "runs of 1025 blocks".
std::string sharding_name(const cp::Sharding& s);

// Everything one rank holds on its (current) device for one case, and the
// steps it runs. Build it with the rank's device current; every call enqueues
// on `stream` (a blocking stream of that device).
class CpRank {
 public:
  // from_scores: propose by a selection over the block scores (cp::local_candidates)
  // instead of from the indexer's own top-k (cp::topk_candidates); merge: how
  // the partial results become the output.
  CpRank(const BenchCase& c, const cuda::cp::Group& group, std::uint64_t seed, bool from_scores,
         cuda::cp::PartialMerge merge, cuda::Stream stream);

  // cuda::index on the owned blocks, then the layer (propose, exchange, merge,
  // owned attention, exchange, combine): the context-parallel step.
  void step(cuda::Stream stream) const;
  // The two halves of step(): block scores, candidates, their exchange and the
  // merged top-k; then owned attention, the partials' exchange and the combine.
  void index_phase(cuda::Stream stream) const;
  void attend_phase(cuda::Stream stream) const;
  // The single-GPU path on the same caches (only with one rank, which owns
  // every block): cuda::index with its own top-k, then cuda::attend.
  void single_index(cuda::Stream stream) const;
  void single_attend(cuda::Stream stream) const;

  // Synchronous downloads. The merged global top-k [num_tokens, H, topk] and
  // output [num_tokens, num_q_heads, 128] bf16 of the context-parallel step;
  // the single path's top-k and output.
  std::vector<std::int32_t> cp_topk() const;
  std::vector<std::uint16_t> cp_output() const;
  std::vector<std::int32_t> single_topk() const;
  std::vector<std::uint16_t> single_output() const;

  std::int64_t owned_pages() const { return owned_pages_; }
  // Index-cache bytes of the owned blocks: what this rank's indexer scans.
  double index_bytes() const;
  // Bytes one rank sends in the candidate and partial all-gathers.
  double candidate_bytes() const { return double(plan_.candidate_bytes()); }
  double partial_bytes() const { return double(plan_.partial_bytes()); }
  double device_bytes() const;

 private:
  BenchCase c_;
  bool from_scores_ = false;
  BatchMetadata meta_;
  std::int32_t max_blocks_ = 0;
  std::int64_t owned_pages_ = 0;
  DeviceBuffer step_arrays_;  // query_start | seq_lens | token_request
  DeviceBuffer table_;        // [num_requests, max_blocks]: local page or -1
  DeviceBuffer kv_, index_;   // owned pages of the main and index caches
  DeviceBuffer q_, index_q_;  // [T, num_q_heads, 128], [T, H, 128] bf16
  DeviceBuffer scores_;       // cuda::index workspace; the scores stay at its start
  DeviceBuffer index_topk_;   // [T, H, topk]: cuda::index's own selection
  DeviceBuffer layer_ws_;
  DeviceBuffer out_, single_out_;  // [T, num_q_heads, 128] bf16
  StepView view_;
  IndexerArgs index_args_;
  AttentionArgs attention_args_;  // out_, topk unused (the layer's owned entries)
  AttentionArgs single_args_;     // single_out_, topk = index_topk_
  cuda::cp::LayerPlan plan_;
};

}  // namespace msa::tool
