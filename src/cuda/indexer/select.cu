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
// ballots. The passes read a row's scores from shared memory, not each with a
// round trip to L2 per 32 candidates (a 1,024-block row took ~20 us that way):
// a persistent grid of warps, each taking rows w, w + warps, ..., copies its
// next row's scores in by cp.async (16-byte pieces, every load in flight)
// while it ranks the current one's candidates, so that the scores stream in
// instead of costing a round trip per row. Rows longer than one warp's stage
// fits in shared memory (over 56K blocks, 7M tokens) read the scores where
// they are.
//
// A step of few long rows (a decode batch at long context) would leave most
// SMs idle and each row on one warp; there a block of kWarps warps takes a row
// (select_block_kernel): every warp stages the candidates, warp 0 gathers and
// takes the winners, and where the radix select is needed the block shares one
// histogram and cuts the ascending pass into one contiguous chunk per warp,
// each warp told how many winners and threshold ties the chunks before it
// hold.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/ptx.cuh"
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

constexpr int kWarps = 8;  // per CTA of the block-per-row kernel
// Shared memory for the staged keys of a block-per-row CTA, within the 48 KB a
// kernel may use without opting in.
constexpr std::int32_t kStageBytes = 40 * 1024;
// The streamed warp-per-row kernel: at most kStreamWarps warps a CTA (the
// register file's limit at 64 registers), one CTA an SM, each warp with a
// histogram and a row's stage in kStreamBytes of dynamic shared memory.
constexpr int kStreamWarps = 32;
constexpr std::int32_t kStreamBytes = 220 * 1024;

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
  std::int32_t stage = 0;         // staged scores per warp (0: none); a multiple of 4 in select_kernel
};

// The winners among the `gathered` candidates of hist (gather_above_bound or
// StagedRow::gather), written to out[head + place] in ascending order.
__device__ __forceinline__ void take_ranked(const std::uint32_t* hist, std::int32_t gathered, std::int32_t head,
                                            std::int32_t pick, std::int32_t* out, int lane) {
  const Threshold th = rank_gathered(hist, gathered, pick, lane);
  const auto take = [out, head](std::int32_t place, std::int32_t i) { out[head + place] = head + i; };
  take_gathered(hist, gathered, th, lane, take);
}

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
  take_ranked(hist, gathered, head, pick, out, lane);
  return true;
}

// Selects a row's `pick` winners among candidates [head, tail) by the radix
// select and one ascending pass, keys by key_at(i) for candidate head + i.
template <class KeyAt>
__device__ __forceinline__ void select_by_radix(const KeyAt& key_at, std::int32_t head, std::int32_t tail,
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

// Selects a row's `pick` winners among candidates [head, tail), keys by key_at(i) for candidate head + i.
template <class KeyAt>
__device__ __forceinline__ void select_between(const KeyAt& key_at, std::uint32_t most, std::int32_t head,
                                               std::int32_t tail, std::int32_t pick, std::uint32_t* hist,
                                               std::int32_t* out, int lane) {
  if (select_filtered(key_at, most, head, tail - head, pick, hist, out, lane)) return;
  select_by_radix(key_at, head, tail, pick, hist, out, lane);
}

// A row's selection problem (contract 5): n = last + 1 eligible blocks, of
// which [0, head) and [tail, n) are forced when n > topk, and `pick` places go
// to candidates [head, tail).
struct Row {
  std::int32_t* out = nullptr;  // [topk]
  const float* scores = nullptr;  // [max_blocks]
  std::int32_t n = 0, head = 0, tail = 0, pick = 0;
};

// The row's last eligible block (-1: none).
__device__ __forceinline__ std::int32_t row_last(const SelectParams& p, std::int64_t row) {
  const std::int32_t pos = p.step.position(static_cast<std::int32_t>(row / p.num_heads));
  return pos < 0 ? -1 : min(pos / kBlockSize, p.block_limit - 1);
}

// Fills the row's tail, writes everything but the picked candidates (thread
// `i` of `threads`), and says whether candidates remain to be picked.
__device__ __forceinline__ bool prepare_row(const SelectParams& p, std::int64_t row, std::int32_t last, int i,
                                            int threads, Row& r) {
  const std::int32_t t = static_cast<std::int32_t>(row / p.num_heads);
  const std::int32_t h = static_cast<std::int32_t>(row - std::int64_t(t) * p.num_heads);
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

// A row's candidate scores [head, tail) copied into a stage by cp.async:
// candidate i lands at stage[i + off], off the float offset of the first
// score within its 16 bytes, so that the whole 16-byte pieces between the
// row's ends copy as they lie (the ends 4 bytes a lane). The stage's pieces
// are padded with NaN before and after the row, so that the passes below read
// whole pieces without bounds. Every lane of the warp calls it; the caller
// commits the copies.
__device__ __forceinline__ std::int32_t stage_row(const Row& r, float* stage, int lane) {
  const float* src = r.scores + r.head;
  const std::int32_t count = r.tail - r.head;
  const std::int32_t off = static_cast<std::int32_t>((reinterpret_cast<std::uintptr_t>(src) >> 2) & 3);
  const std::int32_t lead = min(count, (4 - off) & 3);  // scores before the first whole piece
  const std::int32_t pieces = (count - lead) >> 2;
  const std::int32_t rest = lead + 4 * pieces;          // scores after the last one
  if (lane < lead) cp_async4(smem_u32(stage + off + lane), src + lane);
  for (std::int32_t j = lane; j < pieces; j += 32) cp_async16(smem_u32(stage + off + lead + 4 * j), src + lead + 4 * j);
  if (rest + lane < count) cp_async4(smem_u32(stage + off + rest + lane), src + rest + lane);
  const float nan = __int_as_float(0x7FFFFFFF);
  if (lane < off) stage[lane] = nan;
  if (lane < ((off + count + 3) & ~3) - (off + count)) stage[off + count + lane] = nan;
  return off;
}

// The filter over a staged row, on the scores themselves (no order keys):
// lane l takes a contiguous run of the row's 16-byte pieces (an odd number of
// them, so that a quarter warp's loads meet distinct banks) and keeps the
// maximum of each of the pieces' four places (fmaxf takes NaN as the lowest):
// four distinct candidates, ordered m0 >= m1 >= m2 >= m3. If c lanes have
// m_j >= b, at least c * (j + 1) candidates reach b, so the ceil(pick / (j +
// 1))-th largest m_j over the lanes is a lower bound of T; the bound is the
// highest of those for j = 0, 1, 3 (m1 and m3 to 16 bits). m0 alone is tight
// for scattered winners, m1 and m3 for winners in runs of neighbouring blocks
// (a model's indexer picks such runs), which share a lane. The candidates that
// compare >= the bound as floats (NaN never does) are counted per lane, placed
// by a scan over the lanes and written in ascending order: the candidates and
// order of gather_above_bound.
struct StagedRow {
  const float* stage = nullptr;  // 16-byte aligned; candidate i at stage[i + off], NaN around
  std::int32_t off = 0, count = 0;

  __device__ __forceinline__ std::uint32_t key(std::int32_t i) const { return order_key(stage[i + off]); }
  __device__ __forceinline__ float4 piece(std::int32_t j) const { return reinterpret_cast<const float4*>(stage)[j]; }
  // Lane l's pieces: [l * run, min((l + 1) * run, pieces)).
  __device__ __forceinline__ std::int32_t pieces() const { return (count + off + 3) >> 2; }
  __device__ __forceinline__ std::int32_t run() const { return ((pieces() + 31) >> 5) | 1; }

  // A lower bound of T as an order key (0 where none is found).
  __device__ __forceinline__ std::uint32_t bound(std::int32_t pick, int lane) const {
    const float nan = __int_as_float(0x7FFFFFFF);
    float4 most = make_float4(nan, nan, nan, nan);
    const std::int32_t first = lane * run(), end = min(first + run(), pieces());
    for (std::int32_t j = first; j < end; ++j) {
      const float4 v = piece(j);
      most.x = fmaxf(most.x, v.x), most.y = fmaxf(most.y, v.y);
      most.z = fmaxf(most.z, v.z), most.w = fmaxf(most.w, v.w);
    }
    std::uint32_t m[4] = {order_key(most.x), order_key(most.y), order_key(most.z), order_key(most.w)};
    // Sorted descending by a 4-input network.
    const auto order = [&m](int a, int b) {
      const std::uint32_t hi = max(m[a], m[b]), lo = min(m[a], m[b]);
      m[a] = hi, m[b] = lo;
    };
    order(0, 1), order(2, 3), order(0, 2), order(1, 3), order(1, 2);
    const std::uint32_t b0 = warp::warp_kth_largest_sorted(m[0], pick, lane);
    // m1 and m3 cut to their keys' high 16 bits (rounded down, so still
    // bounds) and sorted together as the halves of one word.
    const std::uint32_t halves = warp::warp_sort_halves((m[1] & 0xFFFF0000u) | (m[3] >> 16), lane);
    const std::uint32_t b1 = __shfl_sync(0xffffffffu, halves, ((pick + 1) >> 1) - 1) & 0xFFFF0000u;
    const std::uint32_t b3 = __shfl_sync(0xffffffffu, halves, ((pick + 3) >> 2) - 1) << 16;
    return max(b0, max(b1, b3));
  }

  // The candidates whose key reaches `bound` (> 0, a number's key), in
  // ascending order into hist as gather_above_bound does, unless there are more
  // than kMaxGathered; returns how many there are.
  __device__ __forceinline__ std::int32_t gather(std::uint32_t bound, std::uint32_t* hist, int lane) const {
    // The least float whose key reaches bound: x >= it exactly when key(x) >=
    // bound (-0 and +0 alike). A bound cut to 16 bits below -inf's key
    // admits every number: -inf.
    const float least = __uint_as_float((bound & 0x80000000u) ? (bound & 0x7FFFFFFFu) : min(~bound, 0xFF800000u));
    const std::int32_t first = lane * run(), end = min(first + run(), pieces());
    std::int32_t mine = 0;
    for (std::int32_t j = first; j < end; ++j) {
      const float4 v = piece(j);
      mine += (v.x >= least ? 1 : 0) + (v.y >= least ? 1 : 0) + (v.z >= least ? 1 : 0) + (v.w >= least ? 1 : 0);
    }
    std::int32_t upto = mine;  // inclusive scan over the lanes
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {
      const std::int32_t v = __shfl_up_sync(0xffffffffu, upto, m);
      if (lane >= m) upto += v;
    }
    const std::int32_t total = __shfl_sync(0xffffffffu, upto, 31);
    if (total > kMaxGathered) return total;
    std::int32_t at = upto - mine;
    for (std::int32_t j = first; mine > 0 && j < end; ++j) {
      const float4 v = piece(j);
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (f[e] >= least) {
          hist[at] = order_key(f[e]);
          hist[kMaxGathered + at] = static_cast<std::uint32_t>(4 * j + e - off);
          ++at;
          --mine;
        }
      }
    }
    __syncwarp();
    return total;
  }
};

// One warp per row: a persistent grid, warp w taking rows w, w + warps, ....
// The next row's scores are copied into the warp's stage as soon as the
// current row's candidates are gathered, so that the copy flies while the
// threshold is ranked and the winners taken. Each lane finds the last block
// of one of the warp's next 32 rows at a time, so that the positions' round
// trips come once per 32 rows.
__global__ void __launch_bounds__(kStreamWarps * 32, 1) select_kernel(const SelectParams p) {
  extern __shared__ __align__(16) std::uint32_t smem_all[];  // per warp: [kBins] histogram, [p.stage] stage
  const int warps = int(blockDim.x >> 5);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  std::uint32_t* hist = smem_all + std::int64_t(warp) * (kBins + p.stage);
  float* stage = reinterpret_cast<float*>(hist + kBins);
  const std::int64_t stride = std::int64_t(gridDim.x) * warps;
  std::int64_t row = std::int64_t(blockIdx.x) * warps + warp;
  if (row >= p.num_rows) return;  // whole warp; no block-wide barrier below

  std::int32_t lasts = -1;  // lane j: the last block of the batch's row j
  std::int32_t batch = 0;   // rows of the warp taken before the current batch of 32
  std::int32_t taken = 0;   // rows of the warp taken
  // A row fits the stage with the 3 scores its first piece may hold before it.
  auto staged = [&](const Row& r) { return r.tail - r.head + 3 <= p.stage; };
  // Row `at`'s selection problem, its copy issued where it is staged.
  Row next;
  bool next_picks = false;
  std::int32_t next_off = 0;
  auto prepare = [&](std::int64_t at) {
    next_picks = false;
    if (at < p.num_rows) {
      if (taken == batch + 32 || taken == 0) {
        batch = taken;
        const std::int64_t mine = at + std::int64_t(lane) * stride;
        lasts = mine < p.num_rows ? row_last(p, mine) : -1;
      }
      const std::int32_t last = __shfl_sync(0xffffffffu, lasts, taken - batch);
      ++taken;
      next_picks = prepare_row(p, at, last, lane, 32, next);
      if (next_picks && staged(next)) next_off = stage_row(next, stage, lane);
    }
    cp_async_commit();
  };

  prepare(row);
  for (; row < p.num_rows; row += stride) {
    const Row cur = next;
    const bool cur_picks = next_picks;
    cp_async_wait<0>();
    __syncwarp();
    bool issued = false;
    if (cur_picks) {
      if (staged(cur)) {
        const StagedRow sr{stage, next_off, cur.tail - cur.head};
        const std::uint32_t bound = cur.pick <= 32 ? sr.bound(cur.pick, lane) : 0u;
        const std::int32_t gathered = bound > 0 ? sr.gather(bound, hist, lane) : kMaxGathered + 1;
        if (gathered <= kMaxGathered) {
          prepare(row + stride);  // the stage is read: the next row's copy flies from here
          issued = true;
          take_ranked(hist, gathered, cur.head, cur.pick, cur.out, lane);
        } else {
          select_by_radix([&sr](std::int32_t i) { return sr.key(i); }, cur.head, cur.tail, cur.pick, hist, cur.out,
                          lane);
        }
      } else {
        const float* s = cur.scores;
        const std::int32_t head = cur.head, count = cur.tail - cur.head;
        const auto key_at = [s, head](std::int32_t i) { return order_key(s[head + i]); };
        select_between(key_at, lane_max(key_at, count, lane), head, cur.tail, cur.pick, hist, cur.out, lane);
      }
    }
    __syncwarp();  // the stage and the histogram are read before they are written again
    if (!issued) prepare(row + stride);
  }
  cp_async_wait<0>();
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
  if (!prepare_row(p, row, row_last(p, row), int(threadIdx.x), int(blockDim.x), r)) return;
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
  // A persistent grid of warps, at most as many a CTA as their stages fit
  // kStreamBytes (a stage: block_limit scores and the 3 a 16-byte piece may
  // hold before the first, in whole pieces), and no more than spreads the
  // rows over every SM; none staged past one warp.
  const std::int64_t per_stage = (std::int64_t(std::max(block_limit, 1)) + 3 + 3) / 4 * 4;
  const std::int64_t per_warp = 4 * (kBins + per_stage);
  const int fit = static_cast<int>(std::min<std::int64_t>(kStreamWarps, kStreamBytes / per_warp));
  p.stage = fit > 0 ? static_cast<std::int32_t>(per_stage) : 0;
  const int sms = device_sm_count();
  const int cta_warps = static_cast<int>(
      std::min<std::int64_t>(fit > 0 ? fit : kStreamWarps, (p.num_rows + sms - 1) / sms));
  const std::size_t smem = std::size_t(cta_warps) * 4 * (kBins + std::size_t(p.stage));
  static std::atomic<std::uint64_t> raised{0};
  attention::raise_smem_limit_once(raised, select_kernel, kStreamBytes);
  const std::int64_t ctas = (p.num_rows + cta_warps - 1) / cta_warps;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>(ctas, sms)));
  select_kernel<<<grid, cta_warps * 32, smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::indexer
