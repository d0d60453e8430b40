// Top-k block selection of the indexer (contract 5), bit-identical to
// cpu::select_row: one warp per row (t, h), O(blocks) work per row.
//
// With n = last + 1 eligible blocks: n <= topk selects all of them. Otherwise
// blocks [0, init) and [n - local, n) are forced and the candidates between
// compete for pick = topk - init - local places under msa/select.hpp's order
// (higher score first, NaN lowest, ties to the lower id). Scores are mapped to
// order-preserving 32-bit keys (NaN -> 0, -0 -> +0) and the winners are every
// key > T and the first of the keys == T (lowest ids), T the threshold key
// (cuda/common/warp_select.cuh). Usually the few candidates that reach a lower
// bound of T are gathered, T is ranked among them and the winners are taken
// from them; where those are many, a radix select finds T and one last
// ascending pass over the row takes the winners, in ascending order with
// ballots. The warp first copies its row's candidate keys into shared memory
// (every load in flight at once), so that the passes do not each wait on a
// round trip to L2 per 32 candidates: a 1,024-block row took ~20 us that way.
// Rows longer than the launch's stage (a few rows of over 10K blocks, 1.3M
// tokens) read the scores where they are.
//
// A step of few long rows (a decode batch at long context) would leave most
// SMs idle and each row on one warp; there a block of kWarps warps takes a row
// (select_block_kernel): every warp stages the candidates, warp 0 gathers and
// takes the winners, and where the radix select is needed the block shares one
// histogram and cuts the ascending pass into one contiguous chunk per warp,
// each warp told how many winners and threshold ties the chunks before it
// hold.
#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/warp_select.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

using warp::kBins;
using warp::lanes_below;
using warp::order_key;
using warp::block_radix_threshold;
using warp::gather_above_bound;
using warp::kMaxGathered;
using warp::lane_max;
using warp::radix_threshold;
using warp::rank_gathered;
using warp::take_gathered;
using warp::Threshold;

constexpr int kWarps = 8;  // at most, per CTA
// Shared memory for the staged keys of a CTA, within the 48 KB a kernel may
// use without opting in (the histograms take 8 KB).
constexpr std::int32_t kStageBytes = 40 * 1024;

struct SelectParams {
  StepView step;
  const float* scores = nullptr;  // [num_tokens, H, max_blocks]
  float* fill = nullptr;          // [num_tokens, H, max_blocks] or null
  std::int32_t max_blocks = 0;
  std::int32_t block_limit = 0;
  std::int32_t num_heads = 0;
  TopkView out;                   // [num_tokens, H, topk]
  std::int32_t init_blocks = 0;
  std::int32_t local_blocks = 0;
  std::int64_t num_rows = 0;
  std::int32_t stage = 0;         // staged keys per warp (0: none)
};

// The winners among the candidates that reach the lower bound (cuda/common/
// warp_select.cuh), written to out[head + place] in ascending order; false
// when too many reach it (or pick > 32), with nothing written. `most`: the
// lane's largest key (lane_max). Every lane of the warp calls it together.
template <class KeyAt>
__device__ __forceinline__ bool select_filtered(const KeyAt& key_at, std::uint32_t most, std::int32_t head,
                                                std::int32_t count, std::int32_t pick, std::uint32_t* hist,
                                                std::int32_t* out, int lane) {
  if (pick > 32) return false;
  const std::int32_t gathered = gather_above_bound(key_at, count, pick, most, hist, lane);
  if (gathered > kMaxGathered) return false;
  const Threshold th = rank_gathered(hist, gathered, pick, lane);
  const auto take = [out, head](std::int32_t place, std::int32_t i) { out[head + place] = head + i; };
  take_gathered(hist, gathered, th, lane, take);
  return true;
}

// Selects a row's `pick` winners among candidates [head, tail), keys by key_at(i) for candidate head + i.
template <class KeyAt>
__device__ __forceinline__ void select_between(const KeyAt& key_at, std::uint32_t most, std::int32_t head,
                                               std::int32_t tail, std::int32_t pick, std::uint32_t* hist,
                                               std::int32_t* out, int lane) {
  if (select_filtered(key_at, most, head, tail - head, pick, hist, out, lane)) return;
  const Threshold th = radix_threshold(key_at, tail - head, pick, hist, lane);
  // Ascending pass: keys above the threshold, then the lowest-id ties.
  std::int32_t written = 0, ties_seen = 0;
  for (std::int32_t base = head; base < tail && written < pick; base += 32) {
    const std::int32_t b = base + lane;
    const bool in = b < tail;
    const bool take = th.takes(in, in ? key_at(b - head) : 0u, lane, ties_seen);
    const std::uint32_t takes = __ballot_sync(0xffffffffu, take);
    if (take) out[head + written + __popc(takes & lanes_below(lane))] = b;
    written += __popc(takes);
  }
}

// A row's selection problem (contract 5): n = last + 1 eligible blocks, of
// which [0, head) and [tail, n) are forced when n > topk, and `pick` places go
// to candidates [head, tail).
struct Row {
  std::int32_t* out = nullptr;  // [topk]
  const float* scores = nullptr;  // [max_blocks]
  std::int32_t n = 0, head = 0, tail = 0, pick = 0;
};

// Fills the row's tail, writes everything but the picked candidates (thread
// `i` of `threads`), and says whether candidates remain to be picked.
__device__ __forceinline__ bool prepare_row(const SelectParams& p, std::int64_t row, int i, int threads, Row& r) {
  const std::int32_t t = static_cast<std::int32_t>(row / p.num_heads);
  const std::int32_t h = static_cast<std::int32_t>(row - std::int64_t(t) * p.num_heads);
  const std::int32_t pos = p.step.position(t);
  const std::int32_t last = pos < 0 ? -1 : min(pos / kBlockSize, p.block_limit - 1);
  r.scores = p.scores + row * p.max_blocks;
  if (p.fill != nullptr) {
    float* f = p.fill + row * p.max_blocks;
    for (std::int32_t b = last + 1 + i; b < p.max_blocks; b += threads) f[b] = -INFINITY;
  }
  r.out = p.out.row(t, h);
  const std::int32_t K = p.out.topk;
  r.n = last + 1;
  if (r.n <= K) {
    for (std::int32_t k = i; k < K; k += threads) r.out[k] = k < r.n ? k : -1;
    return false;
  }
  r.head = p.init_blocks;
  r.tail = r.n - p.local_blocks;
  r.pick = K - p.init_blocks - p.local_blocks;
  for (std::int32_t k = i; k < r.head; k += threads) r.out[k] = k;
  for (std::int32_t j = i; j < p.local_blocks; j += threads) r.out[K - p.local_blocks + j] = r.tail + j;
  return r.pick > 0;
}

// One warp per row. (The minimum of one CTA per SM lifts the register
// target ptxas picks for 256 threads, at which it spilled.)
__global__ void __launch_bounds__(kWarps * 32, 1) select_kernel(const SelectParams p) {
  __shared__ std::uint32_t hist_all[kWarps][kBins];
  extern __shared__ std::uint32_t staged_all[];  // [warps][p.stage]
  const int warps = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * warps + warp;
  if (row >= p.num_rows) return;  // whole warp; no block-wide barrier below
  Row r;
  if (!prepare_row(p, row, lane, 32, r)) return;
  const std::int32_t count = r.tail - r.head;
  const float* s = r.scores;
  const std::int32_t head = r.head;
  if (count <= p.stage) {
    std::uint32_t* keys = staged_all + std::int64_t(warp) * p.stage;  // [count]
    std::uint32_t most = 0;  // the lane's largest key, for the filter
#pragma unroll 8
    for (std::int32_t i = lane; i < count; i += 32) {
      const std::uint32_t k = order_key(s[head + i]);
      keys[i] = k;
      most = max(most, k);
    }
    __syncwarp();
    select_between([keys](std::int32_t i) { return keys[i]; }, most, head, r.tail, r.pick, hist_all[warp], r.out,
                   lane);
  } else {
    const auto key_at = [s, head](std::int32_t i) { return order_key(s[head + i]); };
    select_between(key_at, lane_max(key_at, count, lane), head, r.tail, r.pick, hist_all[warp], r.out, lane);
  }
}

// The block's winners among candidates [head, tail) in ascending order, the
// threshold already known: warp w walks chunk w.
//   counts: [kWarps][2] shared scratch (keys above the threshold, ties)
template <class KeyAt>
__device__ __forceinline__ void block_take(const KeyAt& key_at, const Threshold& th, std::int32_t head,
                                           std::int32_t tail, std::int32_t* out, std::int32_t (*counts)[2]) {
  const int warps = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int32_t count = tail - head;
  const std::int32_t chunk = (count + warps * 32 - 1) / (warps * 32) * 32;
  const std::int32_t lo = min(count, warp * chunk), hi = min(count, lo + chunk);
  std::int32_t above = 0, ties = 0;
  for (std::int32_t base = lo; base < hi; base += 32) {
    const std::int32_t i = base + lane;
    const std::uint32_t k = i < hi ? key_at(i) >> th.shift : 0u;
    above += __popc(__ballot_sync(0xffffffffu, i < hi && k > th.prefix));
    ties += __popc(__ballot_sync(0xffffffffu, i < hi && k == th.prefix));
  }
  if (lane == 0) counts[warp][0] = above, counts[warp][1] = ties;
  __syncthreads();
  // Winners and ties of the chunks before this one.
  std::int32_t written = 0, ties_seen = 0;
  for (int w = 0; w < warp; ++w) {
    written += counts[w][0] + max(0, min(counts[w][1], th.need - ties_seen));
    ties_seen += counts[w][1];
  }
  for (std::int32_t base = lo; base < hi; base += 32) {
    const std::int32_t i = base + lane;
    const bool in = i < hi;
    const bool take = th.takes(in, in ? key_at(i) : 0u, lane, ties_seen);
    const std::uint32_t takes = __ballot_sync(0xffffffffu, take);
    if (take) out[head + written + __popc(takes & lanes_below(lane))] = head + i;
    written += __popc(takes);
  }
}

// One block per row: every warp stages the candidates, warp 0 selects through
// the filter, or the whole block by the radix select where the filter fails.
__global__ void __launch_bounds__(kWarps * 32) select_block_kernel(const SelectParams p) {
  __shared__ std::uint32_t hist[kBins];
  __shared__ Threshold decided;
  __shared__ std::int32_t counts[kWarps][2];
  __shared__ bool filtered;
  extern __shared__ std::uint32_t staged[];  // [p.stage]
  const std::int64_t row = blockIdx.x;
  Row r;
  // Every thread of the block takes the same branch (the row is the block's).
  if (!prepare_row(p, row, int(threadIdx.x), int(blockDim.x), r)) return;
  const std::int32_t count = r.tail - r.head;
  const float* s = r.scores;
  const std::int32_t head = r.head;
  const auto select = [&](const auto& key_at) {
    if (threadIdx.x < 32) {
      const int lane = int(threadIdx.x);
      const bool done = select_filtered(key_at, lane_max(key_at, count, lane), head, count, r.pick, hist, r.out, lane);
      if (lane == 0) filtered = done;
    }
    __syncthreads();
    if (filtered) return;
    const Threshold th = block_radix_threshold(key_at, count, r.pick, hist, &decided);
    block_take(key_at, th, head, r.tail, r.out, counts);
  };
  if (count <= p.stage) {
    for (std::int32_t i = threadIdx.x; i < count; i += blockDim.x) staged[i] = order_key(s[head + i]);
    __syncthreads();
    select([](std::int32_t i) { return staged[i]; });
  } else {
    select([s, head](std::int32_t i) { return order_key(s[head + i]); });
  }
}

// Whether a step's rows select with a block each: when they are few enough
// that every row's block runs at once on `sms` SMs (48 of an SM's 64 warps
// taken) and rows may reach 256 blocks (shorter ones take about as long as a
// launch on one warp).
bool block_per_row(std::int64_t rows, std::int32_t block_limit, int sms) {
  return block_limit >= 256 && rows * kWarps <= std::int64_t(std::max(sms, 1)) * 48;
}

}  // namespace

void launch_select(const StepView& step, const float* scores, float* fill, std::int32_t max_blocks,
                   std::int32_t block_limit, std::int32_t num_kv_heads, const TopkView& out,
                   std::int32_t init_blocks, std::int32_t local_blocks, cudaStream_t stream) {
  SelectParams p;
  p.step = step;
  p.scores = scores;
  p.fill = fill;
  p.max_blocks = max_blocks;
  p.block_limit = block_limit;
  p.num_heads = num_kv_heads;
  p.out = out;
  p.init_blocks = init_blocks;
  p.local_blocks = local_blocks;
  p.num_rows = std::int64_t(step.num_tokens) * num_kv_heads;
  if (p.num_rows == 0) return;
  const std::int64_t stage = (std::int64_t(std::max(block_limit, 1)) + 31) / 32 * 32;
  if (block_per_row(p.num_rows, block_limit, device_sm_count())) {
    // Few long rows: a block per row, its candidates staged when they fit.
    p.stage = stage * 4 <= kStageBytes ? static_cast<std::int32_t>(stage) : 0;
    select_block_kernel<<<static_cast<unsigned>(p.num_rows), kWarps * 32, std::size_t(p.stage) * 4, stream>>>(p);
    MSA_CUDA_CHECK_LAUNCH();
    return;
  }
  // Every row's candidates fit the stage when a warp's share of kStageBytes
  // holds block_limit keys; fewer warps per CTA for longer rows.
  int warps = kWarps;
  while (warps > 1 && std::int64_t(warps) * stage * 4 > kStageBytes) --warps;
  p.stage = stage * 4 <= kStageBytes ? static_cast<std::int32_t>(stage) : 0;
  const std::size_t smem = std::size_t(warps) * std::size_t(p.stage) * 4;
  const dim3 grid(static_cast<unsigned>((p.num_rows + warps - 1) / warps));
  select_kernel<<<grid, warps * 32, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::indexer
