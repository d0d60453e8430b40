// (a) of context parallelism: a rank's candidates from its block scores, equal
// to msa::cp::local_candidates row by row, or from its own top-k, equal to
// msa::cp::candidates_from_topk.
//
// One warp per row (t, h). The row's owned, non-forced, eligible blocks form an
// arithmetic progression (cp_device.cuh), so the warp reads only those columns.
// With n of them and n <= topk all are candidates. Otherwise a radix select
// over order-preserving 32-bit keys (cuda/common/warp_select.cuh: 8 bits a
// pass, a per-warp histogram in shared memory, stopping as soon as every key
// of the prefix wins) finds the threshold key T and how many keys equal to T
// to take — the lowest ids, as the selection order breaks ties (the progression
// ascends); one ascending pass gathers the winners, and a rank count (each
// winner counts the winners that rank before it) writes them in selection
// order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/warp_select.cuh"
#include "cuda/cp/cp_checks.hpp"
#include "cuda/cp/cp_device.cuh"
#include "msa/common.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"
#include "msa/select.hpp"

namespace msa::cuda::cp {
namespace {

using detail::kWarps;
using detail::Progression;
using warp::kBins;
using warp::lanes_below;
using warp::order_key;
using warp::threshold;
using warp::Threshold;

struct CandidateParams : detail::RowParams {
  const float* scores = nullptr;  // [num_tokens, num_heads, max_blocks]
  Candidate* out = nullptr;       // [num_tokens, num_heads, topk]
  std::int32_t rank = 0;
};

__global__ void __launch_bounds__(kWarps * 32) candidates_kernel(const CandidateParams p) {
  __shared__ std::uint32_t hist_all[kWarps][kBins];
  __shared__ float win_score_all[kWarps][kMaxTopk];
  __shared__ std::int32_t win_block_all[kWarps][kMaxTopk];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.num_rows) return;  // whole warp; no block-wide barrier below
  const auto t = static_cast<std::int32_t>(row / p.num_heads);
  const std::int32_t pos = p.step.position(t);
  const std::int32_t last = pos < 0 ? -1 : min(pos / kBlockSize, p.max_blocks - 1);
  const std::int32_t K = p.topk;
  Candidate* out = p.out + row * K;                 // [topk]
  const float* s = p.scores + row * p.max_blocks;  // [max_blocks]
  float* win_score = win_score_all[warp];
  std::int32_t* win_block = win_block_all[warp];

  // Owned blocks in [init_blocks, last - local_blocks]: neither forced nor ineligible.
  const Progression g =
      detail::owned_blocks(p.sharding, p.rank, p.init_blocks, last - p.local_blocks);
  const std::int32_t pick = min(g.count, K);
  const bool all = g.count <= K;
  Threshold th;
  if (!all) {
    const auto key_at = [s, g](std::int32_t i) { return order_key(s[g.at(i)]); };
    th = threshold(key_at, g.count, pick, hist_all[warp], lane);
  }

  // Ascending pass: every key above the threshold, then the lowest-id ties.
  std::int32_t written = 0, ties_seen = 0;
  for (std::int32_t base = 0; base < g.count && written < pick; base += 32) {
    const std::int32_t i = base + lane;
    const bool in = i < g.count;
    const std::int32_t b = in ? g.at(i) : 0;
    const float score = in ? s[b] : 0.0f;
    const bool take = all ? in : th.takes(in, order_key(score), lane, ties_seen);
    const std::uint32_t takes = __ballot_sync(0xffffffffu, take);
    const std::int32_t at = written + __popc(takes & lanes_below(lane));
    if (take && at < K) {
      win_score[at] = score;
      win_block[at] = b;
    }
    written += __popc(takes);
  }
  written = min(written, K);
  __syncwarp();

  // Selection order: a winner's place is the number of winners ranking before it.
  for (std::int32_t j = lane; j < written; j += 32) {
    const float sj = win_score[j];
    const std::int32_t bj = win_block[j];
    std::int32_t place = 0;
    for (std::int32_t i = 0; i < written; ++i)
      place += select::ranks_before(win_score[i], win_block[i], sj, bj) ? 1 : 0;
    out[place] = Candidate{sj, bj};
  }
  for (std::int32_t k = written + lane; k < K; k += 32) out[k] = Candidate{-INFINITY, -1};
}

struct TopkCandidateParams : detail::RowParams {
  const float* scores = nullptr;  // [num_tokens, num_heads, max_blocks]
  TopkView own;                   // [num_tokens, num_heads, topk] the rank's own selection
  Candidate* out = nullptr;       // [num_tokens, num_heads, topk]
  std::int32_t rank = 0;
};

// One warp per row: the owned, non-forced entries of the rank's own top-k, in
// their order, with their scores (ballot compaction), then {-inf, -1}.
__global__ void __launch_bounds__(kWarps * 32) topk_candidates_kernel(const TopkCandidateParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.num_rows) return;  // whole warp
  const auto t = static_cast<std::int32_t>(row / p.num_heads);
  const auto h = static_cast<std::int32_t>(row - std::int64_t(t) * p.num_heads);
  const std::int32_t pos = p.step.position(t);
  const std::int32_t last = pos < 0 ? -1 : min(pos / kBlockSize, p.max_blocks - 1);
  const std::int32_t K = p.topk;
  const std::int32_t* own = p.own.row(t, h);        // [topk]
  Candidate* out = p.out + row * K;                 // [topk]
  const float* s = p.scores + row * p.max_blocks;  // [max_blocks]
  std::int32_t written = 0;
  for (std::int32_t base = 0; base < K; base += 32) {
    const std::int32_t k = base + lane;
    const std::int32_t b = k < K && last >= 0 ? own[k] : -1;
    const bool take = b >= 0 && b <= last && p.sharding.owner(b) == p.rank &&
                      !select::is_forced(b, last, p.init_blocks, p.local_blocks);
    const std::uint32_t takes = __ballot_sync(0xffffffffu, take);
    if (take) out[written + __popc(takes & lanes_below(lane))] = Candidate{s[b], b};
    written += __popc(takes);
  }
  for (std::int32_t k = written + lane; k < K; k += 32) out[k] = Candidate{-INFINITY, -1};
}

}  // namespace

namespace {

// The checks and row numbers both candidate kernels share; false when the step
// has no tokens (nothing to launch).
bool candidate_rows(const char* fn, const StepView& step, const SelectShape& shape, const Sharding& sharding,
                    std::int32_t rank, const float* scores, const Candidate* out, detail::RowParams& p) {
  detail::check_select(fn, step, shape);
  detail::check_sharding(fn, sharding, rank);
  if (step.num_tokens == 0) return false;
  MSA_CHECK(out != nullptr, fn, ": out is null");
  MSA_CHECK(scores != nullptr || shape.max_blocks == 0, fn, ": scores is null");
  p = detail::row_params(step, shape, sharding);
  return true;
}

// One warp per row.
template <class Params>
void launch_rows(void (*kernel)(Params), const Params& p, Stream stream) {
  const dim3 grid(static_cast<unsigned>((p.num_rows + kWarps - 1) / kWarps));
  kernel<<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void topk_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                     std::int32_t rank, const float* scores, const TopkView& own_topk,
                     Candidate* out, Stream stream) {
  const char* fn = "cp::topk_candidates";
  MSA_CHECK(own_topk.topk == shape.topk, fn, ": own_topk.topk = ", own_topk.topk,
            " but topk = ", shape.topk);
  TopkCandidateParams p;
  if (!candidate_rows(fn, step, shape, sharding, rank, scores, out, p)) return;
  MSA_CHECK(own_topk.data != nullptr, fn, ": own_topk.data is null");
  p.scores = scores;
  p.own = own_topk;
  p.out = out;
  p.rank = rank;
  launch_rows(topk_candidates_kernel, p, stream);
}

void local_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                      std::int32_t rank, const float* scores, Candidate* out, Stream stream) {
  CandidateParams p;
  if (!candidate_rows("cp::local_candidates", step, shape, sharding, rank, scores, out, p)) return;
  p.scores = scores;
  p.out = out;
  p.rank = rank;
  launch_rows(candidates_kernel, p, stream);
}

}  // namespace msa::cuda::cp
