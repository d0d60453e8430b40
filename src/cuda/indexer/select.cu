// Top-k block selection of the indexer (contract 5), bit-identical to
// cpu::select_row: one warp per row (t, h), O(blocks) work per row.
//
// With n = last + 1 eligible blocks: n <= topk selects all of them. Otherwise
// blocks [0, init) and [n - local, n) are forced and the candidates between
// compete for pick = topk - init - local places under msa/select.hpp's order
// (higher score first, NaN lowest, ties to the lower id). Scores are mapped to
// order-preserving 32-bit keys (NaN -> 0, -0 -> +0) and a radix select, 8 bits
// per pass with a per-warp histogram in shared memory, finds the threshold key
// T and how many of the T-keyed candidates are taken; one last ascending pass
// takes every key > T and the first of the keys == T (lowest ids), writing
// the winners in ascending order with ballots.
#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

constexpr int kWarps = 8;
constexpr int kBins = 256;

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
};

// Order-preserving key: a ranks before b (higher score) iff key(a) > key(b);
// NaN is 0, the lowest; -0 and +0 are equal.
__device__ __forceinline__ std::uint32_t order_key(float f) {
  if (f != f) return 0u;
  std::uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ std::uint32_t lanes_below(int lane) { return (1u << lane) - 1u; }

// Radix select over the candidates [head, tail) of one row: on return, the
// winners are the candidates whose key >> shift is > prefix, plus the first
// `need` (in ascending id order) of those whose key >> shift == prefix.
__device__ __forceinline__ void radix_threshold(const float* s, std::int32_t head, std::int32_t tail,
                                                std::int32_t pick, std::uint32_t* hist, int lane,
                                                std::uint32_t& prefix, int& shift, std::int32_t& need) {
  prefix = 0;
  need = pick;
  for (shift = 24; shift >= 0; shift -= 8) {
    for (int i = lane; i < kBins; i += 32) hist[i] = 0;
    __syncwarp();
    for (std::int32_t b = head + lane; b < tail; b += 32) {
      const std::uint32_t k = order_key(s[b]);
      if (shift == 24 || (k >> (shift + 8)) == prefix) atomicAdd(&hist[(k >> shift) & 0xFFu], 1u);
    }
    __syncwarp();
    // Lane l holds bins 255 - 8l down to 248 - 8l (highest keys first).
    std::uint32_t cnt[8];
    std::uint32_t sum = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      cnt[i] = hist[kBins - 1 - 8 * lane - i];
      sum += cnt[i];
    }
    std::uint32_t incl = sum;
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {
      const std::uint32_t v = __shfl_up_sync(0xffffffffu, incl, m);
      if (lane >= m) incl += v;
    }
    const std::uint32_t excl = incl - sum;
    const std::uint32_t want = static_cast<std::uint32_t>(need);
    const std::uint32_t found = __ballot_sync(0xffffffffu, excl < want && want <= incl);
    const int src = __ffs(found) - 1;
    std::uint32_t digit = 0, above = excl, equal = 0;
    if (lane == src) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (equal == 0 && above + cnt[i] >= want) {
          digit = kBins - 1 - 8 * lane - i;
          equal = cnt[i];
        } else if (equal == 0) {
          above += cnt[i];
        }
      }
    }
    digit = __shfl_sync(0xffffffffu, digit, src);
    above = __shfl_sync(0xffffffffu, above, src);
    equal = __shfl_sync(0xffffffffu, equal, src);
    need -= static_cast<std::int32_t>(above);
    prefix = (prefix << 8) | digit;
    __syncwarp();  // the histogram is cleared again next pass
    if (equal == static_cast<std::uint32_t>(need)) return;  // every candidate of the prefix wins
  }
  shift = 0;
}

__global__ void __launch_bounds__(kWarps * 32) select_kernel(const SelectParams p) {
  __shared__ std::uint32_t hist_all[kWarps][kBins];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
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

  std::uint32_t prefix;
  int shift;
  std::int32_t need;
  radix_threshold(s, head, tail, pick, hist_all[warp], lane, prefix, shift, need);

  // Ascending pass: keys above the threshold, then the lowest-id ties.
  std::int32_t written = 0, ties_seen = 0;
  for (std::int32_t base = head; base < tail && written < pick; base += 32) {
    const std::int32_t b = base + lane;
    const bool in = b < tail;
    const std::uint32_t k = in ? (order_key(s[b]) >> shift) : 0u;
    const bool above = in && k > prefix;
    const bool tie = in && k == prefix;
    const std::uint32_t ties = __ballot_sync(0xffffffffu, tie);
    const bool take = above || (tie && ties_seen + __popc(ties & lanes_below(lane)) < need);
    const std::uint32_t takes = __ballot_sync(0xffffffffu, take);
    if (take) out[head + written + __popc(takes & lanes_below(lane))] = b;
    written += __popc(takes);
    ties_seen += __popc(ties);
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
  const dim3 grid(static_cast<unsigned>((p.num_rows + kWarps - 1) / kWarps));
  select_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::indexer
