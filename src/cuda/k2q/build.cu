// The k2q plan on the device (include/msa/cuda.hpp, build_k2q): a stable
// sort of the (token, head, slot) edges by row, which keeps the tokens of a
// row in ascending order; the CSR offsets are where each row starts among
// the sorted edges.
//   1. a lane per (token, head, entry), a half warp or a warp per list: the
//      row key of each good entry (absent, ineligible or repeated entries get
//      the key past the last row) and the list's count; each CTA first scans
//      the requests' blocks into their first rows (one CTA before it where
//      the requests are too many for its shared memory);
//   2. where the step's chunks x rows are few (chunk_sort.cuh): a counting
//      sort over chunks of consecutive tokens, which writes the offsets, the
//      tokens and the slots itself; else
//   3. the edges (key, flat index) sorted by key, stable (CUB), and one pass
//      over them: offsets[r], the first sorted key >= r, written by the
//      sorted position where the key steps past r (no per-row histogram,
//      whose atomics meet on the few rows of a step, and no search per row),
//      and the tokens and slots of the placed edges.
// The step's plan is a chain of small kernels whose cost is mostly their
// latency, so each one is a single pass with no dependent round trips.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/checks.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/k2q/build.hpp"
#include "cuda/k2q/chunk_sort.cuh"
#include "msa/common.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace k2q {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Workspace layout (byte offsets), from the step's sizes.
struct Layout {
  std::size_t row_start = 0;     // int64 [num_requests + 1]
  std::size_t keys_in = 0;       // uint32 [edges]
  std::size_t keys_out = 0;      // uint32 [edges]
  std::size_t vals_in = 0;       // int32 [edges] flat edge index (t * H + h) * K + k (device-wide sort only)
  std::size_t vals_out = 0;      // int32 [edges]
  std::size_t temp = 0;          // CUB temporary storage (device-wide sort only)
  std::size_t temp_bytes = 0;
  std::size_t ranks = 0;         // int32 [edges] (chunk sort only)
  std::size_t placed = 0;        // int32 [chunks] (chunk sort only)
  std::size_t chunk_counts = 0;  // int32 [chunks, total_rows] (chunk sort only)
  std::size_t totals = 0;        // int32 [total_rows] (chunk sort only)
  std::size_t done = 0;          // uint32 (chunk sort only)
  std::size_t bytes = 0;
  int end_bit = 1;               // key bits the sort looks at
  int chunk_tokens = 0;          // tokens a chunk of the chunk sort, 0: the device-wide sort
  std::int64_t chunks = 0;
};

int bits_for(std::uint64_t max_value) {
  int b = 1;
  while (b < 32 && (std::uint64_t(1) << b) <= max_value) ++b;
  return b;
}

// The chunk sort (chunk_sort.cuh) runs where its chunks x rows counts stay
// within the edges (beyond, their scan costs more than the radix sort saves)
// and a chunk fits rank_chunks' shared memory: on the smallest chunks (the
// most CTAs) that make at most kMaxChunks, or else the largest; elsewhere the
// device-wide sort.
constexpr std::int64_t kMaxChunks = 256;
struct Chunking {
  int tokens = 0;  // 0: no chunk sort
  std::int64_t chunks = 0;
};
Chunking chunking_for(std::int64_t num_tokens, std::int64_t edges_per_token, std::int64_t total_rows) {
  const std::int64_t edges = num_tokens * edges_per_token;
  if (edges == 0 || total_rows == 0) return {};
  const std::int64_t budget = edges + 65536;
  Chunking fit;
  for (const int tokens : {32, 64, 128, 256}) {
    const std::int64_t chunks = (num_tokens + tokens - 1) / tokens;
    if (chunk_shared_bytes(total_rows, tokens, edges_per_token) > kChunkSharedBytes || chunks * total_rows > budget)
      continue;
    fit = {tokens, chunks};
    if (chunks <= kMaxChunks) break;
  }
  return fit;
}

Layout layout_of(std::int32_t num_tokens, std::int32_t num_requests, int num_kv_heads, int topk,
                 std::int64_t num_rows) {
  Layout l;
  const std::int64_t edges = std::int64_t(num_tokens) * num_kv_heads * topk;
  const std::int64_t total_rows = num_rows * num_kv_heads;
  l.end_bit = bits_for(std::uint64_t(total_rows));  // keys in [0, total_rows]
  std::size_t at = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t o = at;
    at = align_up(at + bytes);
    return o;
  };
  l.row_start = take(sizeof(std::int64_t) * std::size_t(num_requests + 1));
  l.keys_in = take(sizeof(std::uint32_t) * std::size_t(edges));
  l.keys_out = take(sizeof(std::uint32_t) * std::size_t(edges));
  l.vals_out = take(sizeof(std::int32_t) * std::size_t(edges));
  const Chunking chunking = chunking_for(num_tokens, std::int64_t(num_kv_heads) * topk, total_rows);
  if (chunking.tokens > 0) {
    l.chunk_tokens = chunking.tokens;
    l.chunks = chunking.chunks;
    l.ranks = take(sizeof(std::int32_t) * std::size_t(edges));
    l.placed = take(sizeof(std::int32_t) * std::size_t(l.chunks));
    l.chunk_counts = take(sizeof(std::int32_t) * std::size_t(l.chunks * total_rows));
    l.totals = take(sizeof(std::int32_t) * std::size_t(total_rows));
    l.done = take(sizeof(unsigned));
    l.bytes = at;
    return l;
  }
  l.vals_in = take(sizeof(std::int32_t) * std::size_t(edges));
  std::size_t sort = 0;
  MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const std::uint32_t*>(nullptr),
                                                 static_cast<std::uint32_t*>(nullptr),
                                                 static_cast<const std::int32_t*>(nullptr),
                                                 static_cast<std::int32_t*>(nullptr), edges, 0, l.end_bit));
  l.temp_bytes = std::max(sort, std::size_t(1));
  l.temp = take(l.temp_bytes);
  l.bytes = at;
  return l;
}

// row_start[r] = the blocks (ceil(seq_len / 128), 0 for padding requests)
// of the requests before r, r in [0, num_requests], by the whole CTA,
// kScanThreads requests at a time.
//   seq_lens: [num_requests]; row_start: [num_requests + 1] (global or shared)
constexpr int kScanThreads = 256;
static_assert(kScanThreads == kThreads, "key_edges scans with its own CTA");
__device__ __forceinline__ void scan_row_starts(const std::int32_t* seq_lens, std::int32_t num_requests,
                                                std::int64_t* row_start) {
  using Scan = cub::BlockScan<std::int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  std::int64_t carry = 0;
  for (std::int32_t r0 = 0; r0 <= num_requests; r0 += kScanThreads) {
    const std::int32_t r = r0 + std::int32_t(threadIdx.x);
    const std::int64_t blocks =
        r < num_requests && seq_lens[r] > 0 ? (std::int64_t(seq_lens[r]) + kBlockSize - 1) / kBlockSize : 0;
    std::int64_t before = 0, total = 0;
    Scan(temp).ExclusiveSum(blocks, before, total);
    if (r <= num_requests) row_start[r] = carry + before;
    carry += total;
    __syncthreads();  // temp is reused by the next chunk; row_start complete after the last
  }
}

// One CTA: row_start of steps with more than kCtaRequests requests, which
// key_edges then reads instead of scanning them itself.
constexpr int kCtaRequests = 1024;
__global__ void __launch_bounds__(kScanThreads) row_starts(const std::int32_t* seq_lens, std::int32_t num_requests,
                                                           std::int64_t* row_start) {
  scan_row_starts(seq_lens, num_requests, row_start);
}

// kLanes lanes per (token, KV head) list (16: two lists a warp, for top-k
// of at most 16), a lane per entry (kLanes at a time): the row key of every
// entry (past the last row when the entry is not placed) and the list's
// count. An entry is placed when it lies in the list's valid prefix (before
// the first -1), is eligible (a block the token may attend), and no earlier
// entry of the list has the same id. row_start: the requests' first rows, or
// null to scan them in the CTA (at most kCtaRequests requests). With
// unplaced.lse, every query head's lse of an entry not placed is -inf.
//   keys, vals: [num_tokens * num_kv_heads * topk] (vals: e at e, or null); counts: [num_tokens, num_kv_heads]
//   row_start: [num_requests + 1]
template <int kLanes>
__global__ void __launch_bounds__(kThreads) key_edges(StepView step, TopkView topk, int num_kv_heads,
                                                      std::int64_t num_rows, const std::int64_t* row_start,
                                                      std::uint32_t* keys, std::int32_t* vals, std::int32_t* counts,
                                                      K2QUnplacedLse unplaced, std::int64_t* check) {
  __shared__ std::int64_t cta_row_start[kCtaRequests + 1];
  if (row_start == nullptr) {
    scan_row_starts(step.seq_lens, step.num_requests, cta_row_start);
    row_start = cta_row_start;
  }
  const std::int64_t lists = std::int64_t(step.num_tokens) * num_kv_heads;
  const std::int64_t list = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  if (__all_sync(0xffffffffu, list >= lists)) return;
  const bool live = list < lists;
  const int lane = int(threadIdx.x & 31), sub = lane % kLanes;
  const unsigned mine = kLanes == 32 ? 0xffffffffu : 0xffffu << (lane & 16);  // this list's lanes
  const unsigned below = mine & ((1u << lane) - 1u), upto = below | (1u << lane);
  const int t = live ? int(list / num_kv_heads) : 0, h = live ? int(list - std::int64_t(t) * num_kv_heads) : 0;
  const int K = topk.topk;
  const std::uint32_t past = std::uint32_t(num_rows * num_kv_heads);
  const int r = live ? step.token_request[t] : -1;
  const bool request_ok = r >= 0 && r < step.num_requests;
  const int pos = request_ok ? step.position(t, r) : -1;
  const std::int64_t first_row = request_ok ? std::int64_t(h) * num_rows + row_start[r] : 0;
  const std::int64_t blocks = request_ok ? row_start[r + 1] - row_start[r] : 0;
  const std::int32_t* ids = live ? topk.row(t, h) : nullptr;  // [K]
  bool closed = false;                                         // a -1 in an earlier chunk
  int placed = 0;
  for (int k0 = 0; k0 < K; k0 += kLanes) {  // uniform: every list has K entries
    const int k = k0 + sub;
    const bool in = live && k < K;
    const std::int64_t e = list * K + k;
    const int id = in ? ids[k] : -1;
    // This list's lanes at or below this one whose entry ends the valid prefix.
    const unsigned ends = __ballot_sync(0xffffffffu, in && id < 0) & mine;
    const bool open = !closed && id >= 0 && (ends & upto) == 0;
    // A repeat: the same id at an earlier lane of this list (the other
    // list's lanes are masked off), or in an earlier chunk (K > kLanes).
    bool repeat = (__match_any_sync(0xffffffffu, id) & below) != 0;
    if (in)
      for (int j = 0; j < k0; ++j) repeat = repeat || ids[j] == id;
    bool good = false;
    if (open) {
      if (pos < 0 || id > pos / kBlockSize || id >= blocks) {
        detail::record_bad(check, detail::kBadTopkId, t, h, k, id, r, pos < 0 ? 0 : pos / kBlockSize + 1);
      } else if (!repeat) {
        if (row_start[r] + id >= num_rows) {  // device seq_lens give more rows than the plan holds
          detail::record_bad(check, detail::kBadTopkId, t, h, k, id, r, blocks);
        } else {
          good = true;
        }
      }
    }
    if (in) {
      if (vals != nullptr) vals[e] = std::int32_t(e);
      keys[e] = good ? std::uint32_t(first_row + id) : past;
      if (!good && unplaced.lse != nullptr) {
        // [t, k, h * group + g]
        float* lse = unplaced.lse + ((std::int64_t(t) * K + k) * num_kv_heads + h) * unplaced.group;
        for (int g = 0; g < unplaced.group; ++g) lse[g] = -INFINITY;
      }
    }
    placed += __popc(__ballot_sync(0xffffffffu, good) & mine);
    closed = closed || ends != 0;
  }
  if (live && sub == 0) counts[list] = placed;
}

// offsets[r] = the first of the sorted keys that is >= r, r in [0, total_rows]
// (a row's edges start there; offsets[total_rows] = the edges placed): sorted
// position i writes the rows after the key before it, through its own key
// (position `edges` the rows after the last key). Keys are at most
// total_rows (the past key), so every row is written once. A placed edge
// (key < total_rows) also writes its token and slot.
//   keys, vals: [edges] sorted (vals: flat indices (t * H + h) * K + k);
//   offsets: [total_rows + 1]; tokens, slots: [edges]
__global__ void offsets_and_edges(const std::uint32_t* keys, const std::int32_t* vals, std::int64_t edges,
                                  std::int64_t total_rows, int num_kv_heads, int topk, std::int64_t* offsets,
                                  std::int32_t* tokens, std::int32_t* slots) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i > edges) return;
  const std::int64_t key = i == edges ? total_rows : std::int64_t(keys[i]);
  const std::int64_t from = i == 0 ? 0 : std::int64_t(keys[i - 1]) + 1;
  for (std::int64_t r = from; r <= key; ++r) offsets[r] = i;
  if (key < total_rows) {
    const std::int32_t e = vals[i];
    tokens[i] = e / (num_kv_heads * topk);
    slots[i] = e % topk;
  }
}

unsigned grid_for(std::int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }
static_assert(kChunkThreads == kThreads, "place_edges runs on grid_for's CTAs");

// The chunk sort (chunk_sort.cuh) of the keys key_edges wrote: offsets,
// tokens and slots of the plan.
void sort_and_place(const Layout& l, const std::uint32_t* keys, std::int64_t edges, std::int64_t total_rows,
                    int num_kv_heads, int topk, unsigned char* ws, const K2QDevicePlan& plan, cudaStream_t s) {
  auto* sorted_keys = reinterpret_cast<std::uint32_t*>(ws + l.keys_out);
  auto* sorted_edges = reinterpret_cast<std::int32_t*>(ws + l.vals_out);
  auto* ranks = reinterpret_cast<std::int32_t*>(ws + l.ranks);
  auto* placed = reinterpret_cast<std::int32_t*>(ws + l.placed);
  auto* chunk_counts = reinterpret_cast<std::int32_t*>(ws + l.chunk_counts);
  auto* totals = reinterpret_cast<std::int32_t*>(ws + l.totals);
  auto* done = reinterpret_cast<unsigned*>(ws + l.done);
  const int edges_per_token = num_kv_heads * topk;
  const auto shared = std::size_t(chunk_shared_bytes(total_rows, l.chunk_tokens, edges_per_token));
  if (shared > 48 * 1024)
    MSA_CUDA_CHECK(cudaFuncSetAttribute(rank_chunks, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared)));
  rank_chunks<<<unsigned(l.chunks), kChunkThreads, shared, s>>>(keys, edges, total_rows, l.chunk_tokens,
                                                                edges_per_token, sorted_keys, sorted_edges, ranks,
                                                                chunk_counts, placed, done);
  MSA_CUDA_CHECK_LAUNCH();
  scan_chunks<<<unsigned((total_rows + 31) / 32), kChunkScanThreads, 0, s>>>(chunk_counts, l.chunks, total_rows,
                                                                              totals, plan.offsets, done);
  MSA_CUDA_CHECK_LAUNCH();
  place_edges<<<grid_for(edges), kChunkThreads, 0, s>>>(sorted_keys, sorted_edges, ranks, edges,
                                                         std::int64_t(l.chunk_tokens) * edges_per_token, placed,
                                                         chunk_counts, total_rows, plan.offsets, num_kv_heads, topk,
                                                         plan.tokens, plan.slots);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace k2q

std::size_t k2q_workspace_bytes(std::int32_t num_tokens, std::int32_t num_requests, int num_kv_heads, int topk,
                                std::int64_t num_rows) {
  MSA_CHECK(num_tokens >= 0 && num_requests >= 0 && num_kv_heads > 0 && topk > 0 && num_rows >= 0,
            "k2q_workspace_bytes: num_tokens = ", num_tokens, ", num_requests = ", num_requests,
            ", num_kv_heads = ", num_kv_heads, ", topk = ", topk, ", num_rows = ", num_rows,
            " (need >= 0, > 0, > 0, >= 0)");
  return k2q::layout_of(num_tokens, num_requests, num_kv_heads, topk, num_rows).bytes;
}

bool k2q_sorts_in_chunks(std::int32_t num_tokens, int num_kv_heads, int topk, std::int64_t num_rows) {
  return k2q::chunking_for(num_tokens, std::int64_t(num_kv_heads) * topk, num_rows * num_kv_heads).tokens > 0;
}

void build_k2q_with(const StepView& step, const TopkView& topk, int num_kv_heads, std::int64_t num_rows,
                    const K2QDevicePlan& plan, void* workspace, std::size_t workspace_bytes, Stream stream,
                    const DeviceCheck& check, const K2QUnplacedLse& unplaced) {
  using namespace k2q;
  check::step_shape(step);
  MSA_CHECK(num_kv_heads > 0, "build_k2q: num_kv_heads = ", num_kv_heads, " must be > 0");
  MSA_CHECK(topk.topk > 0, "build_k2q: topk.topk = ", topk.topk, " must be > 0");
  MSA_CHECK(num_rows >= 0, "build_k2q: num_rows = ", num_rows, " is negative");
  check::topk_view(topk, step.num_tokens, num_kv_heads, "build_k2q: topk");
  const std::int64_t edges = std::int64_t(step.num_tokens) * num_kv_heads * topk.topk;
  const std::int64_t total_rows = num_rows * num_kv_heads;
  MSA_CHECK(edges <= std::numeric_limits<std::int32_t>::max() &&
                total_rows < std::int64_t(std::numeric_limits<std::uint32_t>::max()),
            "build_k2q: ", edges, " edges over ", total_rows, " rows exceed the 32-bit plan indices");
  const Layout l = layout_of(step.num_tokens, step.num_requests, num_kv_heads, topk.topk, num_rows);
  MSA_CHECK(workspace != nullptr && workspace_bytes >= l.bytes, "build_k2q: workspace of ", workspace_bytes,
            " bytes, ", l.bytes, " needed (k2q_workspace_bytes)");
  MSA_CHECK(plan.offsets != nullptr && (edges == 0 || (plan.tokens != nullptr && plan.slots != nullptr &&
                                                       plan.counts != nullptr)),
            "build_k2q: plan.offsets / tokens / slots / counts is null");
  const auto s = static_cast<cudaStream_t>(stream);
  auto* ws = static_cast<unsigned char*>(workspace);
  auto* row_start = reinterpret_cast<std::int64_t*>(ws + l.row_start);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(ws + l.keys_in);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(ws + l.keys_out);
  auto* vals_in = l.chunk_tokens > 0 ? nullptr : reinterpret_cast<std::int32_t*>(ws + l.vals_in);
  auto* vals_out = reinterpret_cast<std::int32_t*>(ws + l.vals_out);
  void* temp = ws + l.temp;
  std::size_t temp_bytes = l.temp_bytes;

  if (edges > 0) {
    // Few requests: each key_edges CTA scans them itself (one launch less).
    const std::int64_t* starts = nullptr;
    if (step.num_requests > kCtaRequests) {
      row_starts<<<1, kScanThreads, 0, s>>>(step.seq_lens, step.num_requests, row_start);
      MSA_CUDA_CHECK_LAUNCH();
      starts = row_start;
    }
    const std::int64_t lists = std::int64_t(step.num_tokens) * num_kv_heads;
    if (topk.topk <= 16)
      key_edges<16><<<grid_for(lists * 16), kThreads, 0, s>>>(step, topk, num_kv_heads, num_rows, starts, keys_in,
                                                              vals_in, plan.counts, unplaced, check.buffer);
    else
      key_edges<32><<<grid_for(lists * 32), kThreads, 0, s>>>(step, topk, num_kv_heads, num_rows, starts, keys_in,
                                                              vals_in, plan.counts, unplaced, check.buffer);
    MSA_CUDA_CHECK_LAUNCH();
    if (l.chunk_tokens > 0) {
      sort_and_place(l, keys_in, edges, total_rows, num_kv_heads, topk.topk, ws, plan, s);
      return;
    }
    temp_bytes = l.temp_bytes;
    MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, edges,
                                                   0, l.end_bit, s));
  }
  offsets_and_edges<<<grid_for(edges + 1), kThreads, 0, s>>>(keys_out, vals_out, edges, total_rows, num_kv_heads,
                                                             topk.topk, plan.offsets, plan.tokens, plan.slots);
  MSA_CUDA_CHECK_LAUNCH();
}

void build_k2q(const StepView& step, const TopkView& topk, int num_kv_heads, std::int64_t num_rows,
               const K2QDevicePlan& plan, void* workspace, std::size_t workspace_bytes, Stream stream,
               const DeviceCheck& check) {
  build_k2q_with(step, topk, num_kv_heads, num_rows, plan, workspace, workspace_bytes, stream, check, {});
}

}  // namespace msa::cuda
