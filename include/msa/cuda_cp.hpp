// Context parallelism on GPUs: one request's KV cache is split by blocks over
// the ranks of an NCCL communicator (msa/context_parallel.hpp holds the per-row
// rules and their CPU simulation; docs/CONTEXT_PARALLEL.md the design). No CUDA
// or NCCL headers here: a stream is a void* (cudaStream_t), a communicator a
// void* (ncclComm_t). Every pointer is a device pointer of the rank's GPU.
//
// Every rank runs the same step (the same queries and batch metadata); rank r
// holds, in its own caches, only the pages of the blocks it owns, with -1 in
// its block tables for the others. One layer on rank r (run_layer does it all):
//   1. propose             its best topk owned, non-forced blocks of every row
//                          (or those of its own indexer top-k)
//   2. exchange_candidates NCCL all-gather of the candidates        (in place)
//   3. merge_topk          merge into the global top-k (the same on every rank,
//                          bit-identical to the single-GPU indexer), then keep
//                          the entries this rank owns
//   4. attend_owned        cuda::attend over the owned entries, lse requested
//   5. exchange_partials   NCCL all-gather of partial outputs and lse (in place)
//   6. combine             lse-weighted merge into the layer's output
// Steps 1, 3, 4 and 6 are plain kernels and steps 2 and 5 are the only
// communication, so a test can replace the exchanges by copies and a caller can
// overlap them with other work. Nothing allocates or synchronizes the host
// after plan_layer: a decode step can be captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>

#include "msa/batch.hpp"
#include "msa/context_parallel.hpp"
#include "msa/cuda.hpp"
#include "msa/dtype.hpp"
#include "msa/ops.hpp"

namespace msa::cuda::cp {

using msa::cp::Candidate;
using msa::cp::Sharding;

// Largest num_ranks * topk the merge accepts (16 ranks at topk 64).
inline constexpr std::int32_t kMaxMergeCandidates = 1024;

// The selection numbers, those of the indexer (IndexerArgs).
struct SelectShape {
  std::int32_t num_kv_heads = 0;
  std::int32_t topk = 16;
  std::int32_t init_blocks = 0;
  std::int32_t local_blocks = 1;
  // Columns of the block scores (the indexer's max_blocks); a row's last block
  // is min(p / 128, max_blocks - 1).
  std::int32_t max_blocks = 0;
};

// ---- kernels (one GPU, no communication) -------------------------------------------

// (a) Rank `rank`'s candidates: for every row (t, h), its best `topk` eligible,
// non-forced, owned blocks in selection order, then {-inf, -1}; rows of padding
// tokens get only padding. Reads only the owned columns of `scores`: the others
// may hold anything. Equal to msa::cp::local_candidates row by row.
//   scores: [num_tokens, num_kv_heads, max_blocks]   out: [num_tokens, num_kv_heads, topk]
void local_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                      std::int32_t rank, const float* scores, Candidate* out, Stream stream);

// (a') The same candidates' role from the rank's own selection, with no second
// pass over its scores: for every row, the owned, non-forced entries of
// `own_topk` with their scores, then {-inf, -1}; equal to
// msa::cp::candidates_from_topk row by row. `own_topk` must be cuda::index's
// top-k over this rank's cache (its block table -1 for every block it does not
// own, so that those score NaN), with the same topk, init and local blocks.
//   scores: [num_tokens, num_kv_heads, max_blocks] (only the owned entries of
//           own_topk are read)
//   own_topk: [num_tokens, num_kv_heads, topk] (any strides)   out: [num_tokens, num_kv_heads, topk]
void topk_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                     std::int32_t rank, const float* scores, const TopkView& own_topk,
                     Candidate* out, Stream stream);

// (b) The global top-k of every row from all ranks' candidates: forced blocks,
// then the best candidates, ids ascending, then -1 — bit-identical to
// msa::cp::merge_candidates and cpu::select_row. A candidate that cannot be
// right (id outside [0, last], forced, or not owned by the rank that proposed
// it) is skipped, so the output never holds an ineligible or repeated id.
//   candidates: [num_ranks, num_tokens, num_kv_heads, topk]
//   out:        [num_tokens, num_kv_heads, topk] written (any strides)
void merge_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                      const Candidate* candidates, const TopkView& out, Stream stream);

// (c) The entries of every top-k row owned by `rank`, in their order, then -1.
// `out` may be `in`.
//   in, out: [num_tokens, num_kv_heads, topk] (any strides, the same topk)
void owned_entries(std::int32_t num_tokens, std::int32_t num_kv_heads, const TopkView& in,
                   const Sharding& sharding, std::int32_t rank, const TopkView& out, Stream stream);

// (d) The lse-weighted merge of the ranks' partial attention results:
//   out = sum_r exp(lse_r - L) out_r,  L = log sum_r exp(lse_r)  (= lse)
// A rank with lse -inf contributes nothing; all -inf gives 0 and -inf.
//   partial_out: [num_ranks, rows, 128] dtype (bf16, fp16 or f32), 16-byte aligned
//   partial_lse: [num_ranks, rows]
//   out: [rows, 128] out_dtype (bf16, fp16 or f32), 16-byte aligned; lse: [rows] or null
void merge_partials(const void* partial_out, const float* partial_lse, DType dtype,
                    std::int32_t num_ranks, std::int64_t rows, void* out, DType out_dtype,
                    float* lse, Stream stream);

// (e) One rank's share of the same merge, for a sum over ranks (an all-reduce):
//   weighted = w_rank out_rank,  w_rank = exp(lse_rank - L)  (the weight of (d));
// 0 where w_rank is 0, whatever out_rank holds.
//   own_out: [rows, 128] dtype (bf16, fp16 or f32), 16-byte aligned
//   partial_lse: [num_ranks, rows] every rank's lse   weighted: [rows, 128] fp32, 16-byte aligned
void weigh_partial(const void* own_out, DType dtype, const float* partial_lse, std::int32_t num_ranks,
                   std::int32_t rank, std::int64_t rows, float* weighted, Stream stream);
// (f) The result from the sum over ranks of (e): out = summed in out_dtype,
// lse = log sum_r exp(lse_r) as (d); rows whose ranks all have lse -inf get 0.
//   summed: [rows, 128] fp32   partial_lse: [num_ranks, rows]
//   out: [rows, 128] out_dtype (bf16, fp16 or f32), 16-byte aligned; lse: [rows] or null
void finish_weighted(const float* summed, const float* partial_lse, std::int32_t num_ranks,
                     std::int64_t rows, void* out, DType out_dtype, float* lse, Stream stream);

// ---- one rank of a layer ------------------------------------------------------------

// How the ranks' partial attention results become the layer's output.
enum class PartialMerge : std::int8_t {
  // All-gather of every rank's output rows and lse, then each rank merges
  // them all (d): a rank sends rows * (128 * out bytes + 4) bytes and
  // receives num_ranks - 1 times as many. Cheapest for decode steps.
  gather,
  // All-gather of the lse alone; each rank weighs its own rows into fp32 (e),
  // an fp32 all-reduce sums them, and (f) converts: about 2 (num_ranks - 1) /
  // num_ranks x rows * 512 bytes through each rank whatever the rank count,
  // and no num_ranks-fold buffer. For long prefill chunks on many ranks.
  reduce,
};

// This rank's place in the group.
struct Group {
  void* comm = nullptr;  // ncclComm_t of sharding.num_ranks ranks, on this rank's GPU;
                         // may be null when the caller does the exchanges itself
  std::int32_t rank = 0;
  Sharding sharding;
};

// A plan: plain values and pointers into the caller's workspace.
struct LayerPlan {
  Group group;
  SelectShape select;
  AttentionPlan attention;  // this rank's attention over its owned blocks
  std::int32_t num_tokens = 0;
  std::int32_t num_q_heads = 0;
  DType out_dtype = DType::bf16;
  Candidate* candidates = nullptr;  // [num_ranks, num_tokens, num_kv_heads, topk]
  std::int32_t* topk = nullptr;     // [num_tokens, num_kv_heads, topk] the global top-k
  std::int32_t* owned = nullptr;    // [num_tokens, num_kv_heads, topk] this rank's entries
  PartialMerge merge = PartialMerge::gather;
  // gather: [num_ranks, num_tokens, num_q_heads, 128] out_dtype, this rank's slice at `rank`;
  // reduce: [num_tokens, num_q_heads, 128] out_dtype, this rank's rows only
  void* partial_out = nullptr;
  float* partial_lse = nullptr;     // [num_ranks, num_tokens, num_q_heads]
  float* weighted = nullptr;        // reduce: [num_tokens, num_q_heads, 128] fp32, summed in place

  std::int64_t candidate_count() const;  // per rank: num_tokens * num_kv_heads * topk
  std::int64_t partial_rows() const;     // per rank: num_tokens * num_q_heads
  // Bytes one rank contributes to each all-gather (it receives num_ranks - 1
  // times as many), or, reduce, its lse plus the all-reduce's buffer.
  std::size_t candidate_bytes() const;   // candidate_count() * 8
  std::size_t partial_bytes() const;     // partial_rows() * (128 * out bytes + 4), reduce (128 * 4 + 4)
};

// Device bytes of a rank's layer workspace (the attention plan's included).
// `args` says the attention problem as for attention_workspace_bytes (its
// pointers may be null); its cache is this rank's.
std::size_t layer_workspace_bytes(const BatchMetadata& meta, const SelectShape& select, const AttentionArgs& args,
                                  std::int32_t num_ranks, const AttentionTuning& tuning = {},
                                  PartialMerge merge = PartialMerge::gather);
// Lays out the workspace and plans this rank's attention (plan_attention).
// Throws msa::Error on a bad group, shapes that disagree, or a short workspace.
LayerPlan plan_layer(const Group& group, const BatchMetadata& meta, const SelectShape& select,
                     const AttentionArgs& args, const Workspace& workspace, Stream stream,
                     const AttentionTuning& tuning = {}, PartialMerge merge = PartialMerge::gather);

// 1. This rank's candidates into its slice of plan.candidates.
//   scores: [num_tokens, num_kv_heads, max_blocks], this rank's indexer scores
void propose(const LayerPlan& plan, const StepView& step, const float* scores, Stream stream);
// 1, from the top-k that cuda::index selected over this rank's cache (topk_candidates):
// one read of topk entries per row instead of a selection over the row's scores.
//   own_topk: [num_tokens, num_kv_heads, topk], the indexer's output next to `scores`
void propose(const LayerPlan& plan, const StepView& step, const float* scores, const TopkView& own_topk,
             Stream stream);
// 2. All-gather of plan.candidates over group.comm (NCCL). Nothing to do for one
// rank (a communicator, when given, is only checked against the group); a
// build without NCCL throws for more ranks.
void exchange_candidates(const LayerPlan& plan, Stream stream);
// 3. plan.topk = the global top-k; plan.owned = this rank's entries of it.
void merge_topk(const LayerPlan& plan, const StepView& step, Stream stream);
// 4. cuda::attend over plan.owned into this rank's slice of the partials
// (reduce: into plan.partial_out).
// `args` gives q, the scale and this rank's cache and block table; its topk,
// out and lse are not used.
void attend_owned(const LayerPlan& plan, const StepView& step, const AttentionArgs& args,
                  Stream stream, const DeviceCheck& check = {});
// 5. All-gather of the partial outputs and lse over group.comm (NCCL), as 2.
// reduce: all-gather of the lse, weigh_own, then an in-place fp32 all-reduce
// (sum) of plan.weighted.
void exchange_partials(const LayerPlan& plan, Stream stream);
// 5 (reduce), between its two collectives: plan.weighted = this rank's rows
// weighed by the gathered lse (weigh_partial), for callers that exchange
// themselves.
void weigh_own(const LayerPlan& plan, Stream stream);
// 6. The merged result (reduce: finish_weighted of plan.weighted).
//   out: [num_tokens, num_q_heads, 128] plan.out_dtype; lse: [num_tokens, num_q_heads] or null
void combine(const LayerPlan& plan, void* out, float* lse, Stream stream);

// Steps 1 to 6; the result goes to args.out and args.lse (if not null).
void run_layer(const LayerPlan& plan, const StepView& step, const float* scores,
               const AttentionArgs& args, Stream stream, const DeviceCheck& check = {});
// The same, step 1 from the indexer's own top-k (the propose overload above).
void run_layer(const LayerPlan& plan, const StepView& step, const float* scores, const TopkView& own_topk,
               const AttentionArgs& args, Stream stream, const DeviceCheck& check = {});

}  // namespace msa::cuda::cp
