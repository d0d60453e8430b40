// Top-k block selection of the indexer (contract 5), bit-identical to
// cpu::select_row: one warp per row (t, h), O(blocks) work per row.
//
// With n = last + 1 eligible blocks: n <= topk selects all of them. Otherwise
// blocks [0, init) and [n - local, n) are forced and the candidates between
// compete for pick = topk - init - local places under msa/select.hpp's order
// (higher score first, NaN lowest, ties to the lower id). Scores are mapped to
// order-preserving 32-bit keys (NaN -> 0, -0 -> +0) and a radix select, 8 bits
// per pass with a per-warp histogram in shared memory, finds the threshold key
// T and how many of the T-keyed candidates are taken (cuda/common/
// warp_select.cuh); one last ascending pass takes every key > T and the first
// of the keys == T (lowest ids), writing the winners in ascending order with
// ballots. The warp first copies its row's candidate keys into shared memory
// (every load in flight at once), so that the passes do not each wait on a
// round trip to L2 per 32 candidates: a 1,024-block row took ~20 us that way.
// Rows longer than the launch's stage (a few rows of over 10K blocks, 1.3M
// tokens) read the scores where they are.
#include <algorithm>
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/warp_select.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

using warp::kBins;
using warp::lanes_below;
using warp::order_key;
using warp::radix_threshold;
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

// Selects a row's `pick` winners among candidates [head, tail), keys by key_at(i) for candidate head + i.
template <class KeyAt>
__device__ __forceinline__ void select_between(const KeyAt& key_at, std::int32_t head, std::int32_t tail,
                                               std::int32_t pick, std::uint32_t* hist, std::int32_t* out, int lane) {
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

__global__ void __launch_bounds__(kWarps * 32) select_kernel(const SelectParams p) {
  __shared__ std::uint32_t hist_all[kWarps][kBins];
  extern __shared__ std::uint32_t staged_all[];  // [warps][p.stage]
  const int warps = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * warps + warp;
  if (row >= p.num_rows) return;  // whole warp; no block-wide barrier below
  const std::int32_t t = static_cast<std::int32_t>(row / p.num_heads);
  const std::int32_t h = static_cast<std::int32_t>(row - std::int64_t(t) * p.num_heads);
  const std::int32_t pos = p.step.position(t);
  const std::int32_t last = pos < 0 ? -1 : min(pos / kBlockSize, p.block_limit - 1);
  const float* s = p.scores + row * p.max_blocks;  // [max_blocks]
  if (p.fill != nullptr) {
    float* f = p.fill + row * p.max_blocks;
    for (std::int32_t b = last + 1 + lane; b < p.max_blocks; b += 32) f[b] = -INFINITY;
  }
  std::int32_t* out = p.out.row(t, h);  // [topk]
  const std::int32_t K = p.out.topk;
  const std::int32_t n = last + 1;
  if (n <= K) {
    for (std::int32_t k = lane; k < K; k += 32) out[k] = k < n ? k : -1;
    return;
  }
  const std::int32_t head = p.init_blocks;
  const std::int32_t tail = n - p.local_blocks;
  const std::int32_t pick = K - p.init_blocks - p.local_blocks;
  for (std::int32_t k = lane; k < head; k += 32) out[k] = k;
  for (std::int32_t i = lane; i < p.local_blocks; i += 32) out[K - p.local_blocks + i] = tail + i;
  if (pick <= 0) return;

  const std::int32_t count = tail - head;
  if (count <= p.stage) {
    std::uint32_t* keys = staged_all + std::int64_t(warp) * p.stage;  // [count]
#pragma unroll 8
    for (std::int32_t i = lane; i < count; i += 32) keys[i] = order_key(s[head + i]);
    __syncwarp();
    select_between([keys](std::int32_t i) { return keys[i]; }, head, tail, pick, hist_all[warp], out, lane);
  } else {
    select_between([s, head](std::int32_t i) { return order_key(s[head + i]); }, head, tail, pick, hist_all[warp],
                   out, lane);
  }
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
  // Every row's candidates fit the stage when a warp's share of kStageBytes
  // holds block_limit keys; fewer warps per CTA for longer rows.
  const std::int64_t stage = (std::int64_t(std::max(block_limit, 1)) + 31) / 32 * 32;
  int warps = kWarps;
  while (warps > 1 && std::int64_t(warps) * stage * 4 > kStageBytes) --warps;
  p.stage = stage * 4 <= kStageBytes ? static_cast<std::int32_t>(stage) : 0;
  const std::size_t smem = std::size_t(warps) * std::size_t(p.stage) * 4;
  const dim3 grid(static_cast<unsigned>((p.num_rows + warps - 1) / warps));
  select_kernel<<<grid, warps * 32, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::indexer
