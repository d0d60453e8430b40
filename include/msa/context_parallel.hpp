// Context parallelism: one request's KV cache spread by blocks over several
// ranks (GPUs). Each rank scores its own blocks and proposes candidates; the
// ranks agree on the global top-k by exchanging (score, block) candidates; each
// rank attends to the selected blocks it owns; the partial outputs are merged
// with lse weights. The functions here are the per-row rules, shared by the CPU
// simulation and the GPU kernels; they reproduce the single-rank indexer and
// attention exactly (selection) or to rounding (attention).
#pragma once

#include <cstdint>

#include "msa/common.hpp"

namespace msa::cp {

// Which rank owns logical block b of a request.
struct Sharding {
  std::int32_t num_ranks = 1;
  // 0: round-robin (block b on rank b % num_ranks, balanced for every length);
  // > 0: contiguous runs of this many blocks (rank = min(b / run, num_ranks - 1)).
  std::int32_t run_blocks = 0;

  MSA_HD std::int32_t owner(std::int32_t b) const {
    if (run_blocks <= 0) return b % num_ranks;
    const std::int32_t r = b / run_blocks;
    return r < num_ranks ? r : num_ranks - 1;
  }
};

// One proposed block of one (token, KV head) row. block -1 = no candidate.
struct Candidate {
  float score;
  std::int32_t block;
};

// Rank `rank`'s candidates for one row: its best `topk` eligible, non-forced,
// owned blocks in selection order (select::ranks_before), padded with
// {-inf, -1}. Forced blocks need no exchange: every rank knows them.
//   scores: [last + 1] (only the owned entries are read), out: [topk]
void local_candidates(const float* scores, std::int32_t last, const Sharding& sharding,
                      std::int32_t rank, std::int32_t topk, std::int32_t init_blocks,
                      std::int32_t local_blocks, Candidate* out);

// Rank `rank`'s candidates for one row from its own selection, without a
// second pass over its scores: the owned, non-forced entries of `own_topk`
// with their scores, then {-inf, -1}. `own_topk` must be the row's top-k by
// the single-rank rule (cpu::select_row, cuda::index) over this rank's scores
// with every block it does not own scoring NaN, as the indexer scores a block
// whose block-table entry is -1. merge_candidates of every rank's list is the
// global top-k, as with local_candidates: masking only lowers blocks the rank
// does not own, so a block of the global top-k also makes its owner's.
//   scores: [last + 1] (only the owned entries of own_topk are read)
//   own_topk: [topk], out: [topk]
void candidates_from_topk(const float* scores, const std::int32_t* own_topk, std::int32_t last,
                          const Sharding& sharding, std::int32_t rank, std::int32_t topk,
                          std::int32_t init_blocks, std::int32_t local_blocks, Candidate* out);

// The row's global top-k from every rank's candidates: forced blocks, then the
// best candidates, ids ascending, then -1 — identical to cpu::select_row on the
// full scores.
//   candidates: [num_ranks * topk], out: [topk]
void merge_candidates(const Candidate* candidates, std::int32_t num_ranks, std::int32_t last,
                      std::int32_t topk, std::int32_t init_blocks, std::int32_t local_blocks,
                      std::int32_t* out);

// The entries of a top-k row owned by `rank`, in their order, then -1.
//   row: [topk], out: [topk]
void owned_entries(const std::int32_t* row, std::int32_t topk, const Sharding& sharding,
                   std::int32_t rank, std::int32_t* out);

// Merges per-rank partial attention results with lse weights:
//   out = sum_r exp(lse_r - L) out_r,  L = log sum_r exp(lse_r).
// A rank with lse -inf (no keys) contributes nothing; all -inf gives 0 and -inf.
//   outs: num_ranks pointers to [n, 128] float, lses: num_ranks pointers to [n]
//   out: [n, 128], lse: [n]
void merge_partials(const float* const* outs, const float* const* lses, std::int32_t num_ranks,
                    std::int64_t n, float* out, float* lse);

}  // namespace msa::cp
