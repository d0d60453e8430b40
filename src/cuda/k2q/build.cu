// The k2q plan on the device (include/msa/cuda.hpp, build_k2q): a stable
// radix sort of the (token, head, slot) edges by row, which keeps the tokens of
// a row in ascending order; the CSR offsets are where each row starts among
// the sorted keys.
//   1. row_start: blocks per request, exclusive sum (CUB);
//   2. one thread per (token, head) list: the row key of each good entry
//      (absent, ineligible or repeated entries get the key past the last
//      row) and the list's count;
//   3. the edges (key, flat index) sorted by key, stable (CUB);
//   4. offsets[r]: the first sorted key >= r (a binary search per row; no
//      per-row histogram, whose atomics meet on the few rows of a step);
//   5. tokens and slots of the first nnz sorted edges.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/checks.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
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
  std::size_t blocks = 0;     // int64 [num_requests + 1] blocks per request, then row_start
  std::size_t row_start = 0;  // int64 [num_requests + 1]
  std::size_t keys_in = 0;    // uint32 [edges]
  std::size_t keys_out = 0;   // uint32 [edges]
  std::size_t vals_in = 0;    // int32 [edges] flat edge index (t * H + h) * K + k
  std::size_t vals_out = 0;   // int32 [edges]
  std::size_t temp = 0;       // CUB temporary storage
  std::size_t temp_bytes = 0;
  std::size_t bytes = 0;
  int end_bit = 1;            // key bits the sort looks at
};

int bits_for(std::uint64_t max_value) {
  int b = 1;
  while (b < 32 && (std::uint64_t(1) << b) <= max_value) ++b;
  return b;
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
  l.blocks = take(sizeof(std::int64_t) * std::size_t(num_requests + 1));
  l.row_start = take(sizeof(std::int64_t) * std::size_t(num_requests + 1));
  l.keys_in = take(sizeof(std::uint32_t) * std::size_t(edges));
  l.keys_out = take(sizeof(std::uint32_t) * std::size_t(edges));
  l.vals_in = take(sizeof(std::int32_t) * std::size_t(edges));
  l.vals_out = take(sizeof(std::int32_t) * std::size_t(edges));
  std::size_t scan_req = 0, sort = 0;
  MSA_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_req, static_cast<const std::int64_t*>(nullptr),
                                               static_cast<std::int64_t*>(nullptr), num_requests + 1));
  MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const std::uint32_t*>(nullptr),
                                                 static_cast<std::uint32_t*>(nullptr),
                                                 static_cast<const std::int32_t*>(nullptr),
                                                 static_cast<std::int32_t*>(nullptr), edges, 0, l.end_bit));
  l.temp_bytes = std::max({scan_req, sort, std::size_t(1)});
  l.temp = take(l.temp_bytes);
  l.bytes = at;
  return l;
}

// Blocks per request: ceil(seq_len / 128), 0 for padding requests.
//   seq_lens: [num_requests]; blocks: [num_requests + 1] (the last is 0)
__global__ void count_blocks(const std::int32_t* seq_lens, std::int32_t num_requests, std::int64_t* blocks) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r > num_requests) return;
  blocks[r] = r < num_requests && seq_lens[r] > 0 ? (std::int64_t(seq_lens[r]) + kBlockSize - 1) / kBlockSize : 0;
}

// One thread per (token, KV head) list: the row key of every entry (past the
// last row when the entry is not placed) and the list's count.
//   keys, vals: [num_tokens * num_kv_heads * topk]; counts: [num_tokens, num_kv_heads]
//   row_start: [num_requests + 1]
__global__ void key_edges(StepView step, TopkView topk, int num_kv_heads, std::int64_t num_rows,
                          const std::int64_t* row_start, std::uint32_t* keys, std::int32_t* vals,
                          std::int32_t* counts, std::int64_t* check) {
  const std::int64_t list = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (list >= std::int64_t(step.num_tokens) * num_kv_heads) return;
  const int t = int(list / num_kv_heads), h = int(list - std::int64_t(t) * num_kv_heads);
  const int K = topk.topk;
  const std::uint32_t past = std::uint32_t(num_rows * num_kv_heads);
  const int r = step.token_request[t];
  const bool request_ok = r >= 0 && r < step.num_requests;
  const int pos = request_ok ? step.position(t, r) : -1;
  const std::int64_t first_row = request_ok ? std::int64_t(h) * num_rows + row_start[r] : 0;
  const std::int64_t blocks = request_ok ? row_start[r + 1] - row_start[r] : 0;
  const std::int32_t* ids = topk.row(t, h);  // [K]
  bool open = true;                          // still inside the valid prefix
  int placed = 0;
  // The row of entry k, or -1 when it is not placed.
  auto place = [&](int k, std::int64_t e) -> std::int64_t {
    vals[e] = std::int32_t(e);
    keys[e] = past;
    const int id = open ? ids[k] : -1;
    if (id < 0) {
      open = false;
      return -1;
    }
    if (pos < 0 || id > pos / kBlockSize || id >= blocks) {
      detail::record_bad(check, detail::kBadTopkId, t, h, k, id, r, pos < 0 ? 0 : pos / kBlockSize + 1);
      return -1;
    }
    bool repeat = false;
    for (int j = 0; j < k; ++j) repeat = repeat || ids[j] == id;
    if (repeat) return -1;
    const std::int64_t row = first_row + id;
    if (row_start[r] + id >= num_rows) {  // device seq_lens give more rows than the plan holds
      detail::record_bad(check, detail::kBadTopkId, t, h, k, id, r, blocks);
      return -1;
    }
    keys[e] = std::uint32_t(row);
    ++placed;
    return row;
  };
  for (int k = 0; k < K; ++k) place(k, list * K + k);
  counts[list] = placed;
}

// offsets[r] = the first of the sorted keys that is >= r, r in [0, total_rows]
// (a row's edges start there; offsets[total_rows] = the edges placed).
//   keys: [edges] sorted; offsets: [total_rows + 1]
__global__ void offsets_from_keys(const std::uint32_t* keys, std::int64_t edges, std::int64_t total_rows,
                                  std::int64_t* offsets) {
  const std::int64_t r = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r > total_rows) return;
  std::int64_t lo = 0, hi = edges;
  while (lo < hi) {
    const std::int64_t mid = (lo + hi) / 2;
    if (std::int64_t(keys[mid]) < r) lo = mid + 1;
    else hi = mid;
  }
  offsets[r] = lo;
}

// tokens[i], slots[i] of the first nnz sorted edges.
//   vals: [edges] sorted flat indices; offsets: [total_rows + 1]
__global__ void emit_edges(const std::int32_t* vals, const std::int64_t* offsets, std::int64_t total_rows,
                           std::int64_t edges, int num_kv_heads, int topk, std::int32_t* tokens,
                           std::int32_t* slots) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= edges || i >= offsets[total_rows]) return;
  const std::int32_t e = vals[i];
  tokens[i] = e / (num_kv_heads * topk);
  slots[i] = e % topk;
}

unsigned grid_for(std::int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

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

void build_k2q(const StepView& step, const TopkView& topk, int num_kv_heads, std::int64_t num_rows,
               const K2QDevicePlan& plan, void* workspace, std::size_t workspace_bytes, Stream stream,
               const DeviceCheck& check) {
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
  auto* blocks = reinterpret_cast<std::int64_t*>(ws + l.blocks);
  auto* row_start = reinterpret_cast<std::int64_t*>(ws + l.row_start);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(ws + l.keys_in);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(ws + l.keys_out);
  auto* vals_in = reinterpret_cast<std::int32_t*>(ws + l.vals_in);
  auto* vals_out = reinterpret_cast<std::int32_t*>(ws + l.vals_out);
  void* temp = ws + l.temp;
  std::size_t temp_bytes = l.temp_bytes;

  count_blocks<<<grid_for(step.num_requests + 1), kThreads, 0, s>>>(step.seq_lens, step.num_requests, blocks);
  MSA_CUDA_CHECK_LAUNCH();
  MSA_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, blocks, row_start, step.num_requests + 1, s));
  if (edges > 0) {
    key_edges<<<grid_for(std::int64_t(step.num_tokens) * num_kv_heads), kThreads, 0, s>>>(
        step, topk, num_kv_heads, num_rows, row_start, keys_in, vals_in, plan.counts, check.buffer);
    MSA_CUDA_CHECK_LAUNCH();
    temp_bytes = l.temp_bytes;
    MSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, edges,
                                                   0, l.end_bit, s));
  }
  offsets_from_keys<<<grid_for(total_rows + 1), kThreads, 0, s>>>(keys_out, edges, total_rows, plan.offsets);
  MSA_CUDA_CHECK_LAUNCH();
  if (edges == 0) return;
  emit_edges<<<grid_for(edges), kThreads, 0, s>>>(vals_out, plan.offsets, total_rows, edges, num_kv_heads,
                                                  topk.topk, plan.tokens, plan.slots);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda
