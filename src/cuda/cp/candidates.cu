// (a) of context parallelism: a rank's candidates from its block scores, equal
// to msa::cp::local_candidates row by row.
//
// One warp per row (t, h). The row's owned, non-forced, eligible blocks form an
// arithmetic progression (cp_device.cuh), so the warp reads only those columns.
// With n of them and n <= topk all are candidates. Otherwise a radix select
// over order-preserving 32-bit keys (8 bits a pass, a per-warp histogram in
// shared memory, stopping as soon as every key of the prefix wins) finds the
// threshold key T and how many keys equal to T to take — the lowest ids, as
// the selection order breaks ties; one ascending pass gathers the winners, and
// a rank count (each winner counts the winners that rank before it) writes
// them in selection order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/cp/cp_checks.hpp"
#include "cuda/cp/cp_device.cuh"
#include "msa/common.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"
#include "msa/select.hpp"

namespace msa::cuda::cp {
namespace {

using detail::kWarps;
using detail::lanes_below;
using detail::order_key;
using detail::Progression;

constexpr int kBins = 256;

struct CandidateParams {
  StepView step;
  const float* scores = nullptr;  // [num_tokens, num_heads, max_blocks]
  Candidate* out = nullptr;       // [num_tokens, num_heads, topk]
  std::int32_t max_blocks = 0;
  std::int32_t num_heads = 0;
  std::int32_t topk = 0;
  std::int32_t init_blocks = 0;
  std::int32_t local_blocks = 0;
  Sharding sharding;
  std::int32_t rank = 0;
  std::int64_t num_rows = 0;
};

// Radix select over the keys of the blocks g (g.count > pick >= 1): on return
// the winners are the blocks whose key >> shift is > prefix, plus the first
// `need` (ascending ids) of those whose key >> shift == prefix.
//   s: [max_blocks] the row's scores; hist: [256] this warp's shared histogram
__device__ void radix_threshold(const float* s, const Progression& g, std::int32_t pick,
                                std::uint32_t* hist, int lane, std::uint32_t& prefix, int& shift,
                                std::int32_t& need) {
  prefix = 0;
  need = pick;
  for (shift = 24;; shift -= 8) {
    for (int i = lane; i < kBins; i += 32) hist[i] = 0;
    __syncwarp();
    for (std::int32_t i = lane; i < g.count; i += 32) {
      const std::uint32_t k = order_key(s[g.at(i)]);
      if (shift == 24 || (k >> (shift + 8)) == prefix) atomicAdd(&hist[(k >> shift) & 0xFFu], 1u);
    }
    __syncwarp();
    // Lane l holds bins 255 - 8l - j, j = 0..7: the highest keys in lane 0.
    std::uint32_t cnt[8];
    std::uint32_t sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      cnt[j] = hist[kBins - 1 - 8 * lane - j];
      sum += cnt[j];
    }
    std::uint32_t incl = sum;
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {
      const std::uint32_t v = __shfl_up_sync(0xffffffffu, incl, m);
      if (lane >= m) incl += v;
    }
    const std::uint32_t excl = incl - sum;
    const auto want = static_cast<std::uint32_t>(need);
    // The lane whose bins hold the want-th best key.
    const int src = __ffs(__ballot_sync(0xffffffffu, excl < want && want <= incl)) - 1;
    std::uint32_t digit = 0, above = excl, equal = 0;
    if (lane == src) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (equal != 0) continue;
        if (above + cnt[j] >= want) {
          digit = kBins - 1 - 8 * lane - j;
          equal = cnt[j];
        } else {
          above += cnt[j];
        }
      }
    }
    digit = __shfl_sync(0xffffffffu, digit, src);
    above = __shfl_sync(0xffffffffu, above, src);
    equal = __shfl_sync(0xffffffffu, equal, src);
    need -= static_cast<std::int32_t>(above);
    prefix = (prefix << 8) | digit;
    __syncwarp();  // the histogram is cleared again by the next pass
    if (equal == static_cast<std::uint32_t>(need) || shift == 0) return;
  }
}

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
  std::uint32_t prefix = 0;
  int shift = 0;
  std::int32_t need = pick;
  if (!all) radix_threshold(s, g, pick, hist_all[warp], lane, prefix, shift, need);

  // Ascending pass: every key above the threshold, then the lowest-id ties.
  std::int32_t written = 0, ties_seen = 0;
  for (std::int32_t base = 0; base < g.count && written < pick; base += 32) {
    const std::int32_t i = base + lane;
    const bool in = i < g.count;
    const std::int32_t b = in ? g.at(i) : 0;
    const float score = in ? s[b] : 0.0f;
    bool take = in;
    if (!all) {
      const std::uint32_t k = in ? order_key(score) >> shift : 0u;
      const bool tie = in && k == prefix;
      const std::uint32_t ties = __ballot_sync(0xffffffffu, tie);
      take = (in && k > prefix) || (tie && ties_seen + __popc(ties & lanes_below(lane)) < need);
      ties_seen += __popc(ties);
    }
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

}  // namespace

void local_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                      std::int32_t rank, const float* scores, Candidate* out, Stream stream) {
  const char* fn = "cp::local_candidates";
  detail::check_select(fn, step, shape);
  detail::check_sharding(fn, sharding, rank);
  if (step.num_tokens == 0) return;
  MSA_CHECK(out != nullptr, fn, ": out is null");
  MSA_CHECK(scores != nullptr || shape.max_blocks == 0, fn, ": scores is null");
  CandidateParams p;
  p.step = step;
  p.scores = scores;
  p.out = out;
  p.max_blocks = shape.max_blocks;
  p.num_heads = shape.num_kv_heads;
  p.topk = shape.topk;
  p.init_blocks = shape.init_blocks;
  p.local_blocks = shape.local_blocks;
  p.sharding = sharding;
  p.rank = rank;
  p.num_rows = std::int64_t(step.num_tokens) * shape.num_kv_heads;
  const dim3 grid(static_cast<unsigned>((p.num_rows + kWarps - 1) / kWarps));
  candidates_kernel<<<grid, kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::cp
