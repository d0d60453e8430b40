// The k2q plan's stable sort of the edges by row as a counting sort over
// chunks of consecutive tokens (build.cu), where a step's chunks x rows are
// few enough: three kernels that each take one pass, against the four of a
// device-wide radix sort.
//   1. rank_chunks: a CTA per chunk of tokens sets, in shared memory, a bit
//      per (row, token of the chunk) for each edge; an edge's rank among its
//      chunk's edges of the same row is then the bits below its token's, and
//      a row's count in the chunk all of its bits (a row takes at most one
//      edge of a token and KV head, so the bits count edges). The chunk's
//      edges are written sorted by row within the chunk;
//   2. scan_chunks: a thread per (row, 16th of the chunks) turns the counts
//      into each chunk's first place within its row and the rows' totals;
//      the CTA done last scans the totals into the CSR offsets;
//   3. place_edges: a sorted edge's place is its row's offset, its chunk's
//      first place in the row and its rank, so neighbouring threads write
//      neighbouring places.
// Chunks are consecutive and ranks follow the tokens, so a row's tokens
// ascend, as the device-wide sort keeps them.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include <cstdint>

namespace msa::cuda::k2q {

constexpr int kChunkThreads = 256;
// rank_chunks' shared memory: a bit per (row, token of the chunk), a row's
// start within the chunk, and the chunk's edges in their sorted order.
constexpr std::int64_t kChunkSharedBytes = 96 * 1024;
constexpr std::int64_t chunk_shared_bytes(std::int64_t total_rows, int tokens_per_chunk, int edges_per_token) {
  return total_rows * (tokens_per_chunk / 8 + 4) + std::int64_t(tokens_per_chunk) * edges_per_token * 4;
}

// One chunk: c = blockIdx.x, its tokens [c x T, c x T + T) with T =
// tokens_per_chunk (a multiple of 32), whose edges are [c x T x L, + T x L)
// with L = edges_per_token. Keys of total_rows or more are edges the plan
// does not place. The chunk's placed edges go to its first placed[c] sorted
// positions, by row and then token: their key, edge index and rank.
//   keys: [edges]; sorted_keys, sorted_edges, sorted_ranks: [edges];
//   chunk_counts: [chunks, total_rows]; placed: [chunks]
//   done: one counter, zeroed here for scan_chunks
//   dynamic shared memory: chunk_shared_bytes(total_rows, T, L)
__global__ void __launch_bounds__(kChunkThreads) rank_chunks(const std::uint32_t* keys, std::int64_t edges,
                                                             std::int64_t total_rows, int tokens_per_chunk,
                                                             int edges_per_token, std::uint32_t* sorted_keys,
                                                             std::int32_t* sorted_edges, std::int32_t* sorted_ranks,
                                                             std::int32_t* chunk_counts, std::int32_t* placed,
                                                             unsigned* done) {
  extern __shared__ unsigned shared[];
  const int words = tokens_per_chunk / 32;
  unsigned* bits = shared;  // [total_rows, words]: bit j of a row, token j of the chunk
  // [total_rows]: a row's first place among the chunk's sorted edges
  auto* first = reinterpret_cast<std::int32_t*>(shared + total_rows * words);
  std::int32_t* order = first + total_rows;  // [T x L]: the chunk's placed edges (e - base), sorted
  const std::int64_t all_words = total_rows * words;
  for (std::int64_t i = threadIdx.x; i < all_words; i += kChunkThreads) bits[i] = 0u;
  if (blockIdx.x == 0 && threadIdx.x == 0) *done = 0u;
  __syncthreads();
  const std::int64_t base = std::int64_t(blockIdx.x) * tokens_per_chunk * edges_per_token;
  const std::int64_t end = base + std::int64_t(tokens_per_chunk) * edges_per_token < edges
                               ? base + std::int64_t(tokens_per_chunk) * edges_per_token
                               : edges;
  for (std::int64_t e = base + threadIdx.x; e < end; e += kChunkThreads) {
    const std::uint32_t key = keys[e];
    if (key >= total_rows) continue;
    const int j = int((e - base) / edges_per_token);
    atomicOr(bits + std::int64_t(key) * words + j / 32, 1u << (j & 31));
  }
  __syncthreads();
  // The rows' counts, and where each row starts among the chunk's edges: a
  // contiguous run of rows a thread, one scan over the threads.
  std::int32_t* counts = chunk_counts + std::int64_t(blockIdx.x) * total_rows;
  const std::int64_t run = (total_rows + kChunkThreads - 1) / kChunkThreads;
  const std::int64_t r0 = std::int64_t(threadIdx.x) * run;
  const std::int64_t r1 = r0 + run < total_rows ? r0 + run : total_rows;
  int mine = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    int n = 0;
    for (int w = 0; w < words; ++w) n += __popc(bits[r * words + w]);
    first[r] = n;
    mine += n;
  }
  using Scan = cub::BlockScan<int, kChunkThreads>;
  __shared__ typename Scan::TempStorage scan;
  int before = 0, all = 0;
  Scan(scan).ExclusiveSum(mine, before, all);
  for (std::int64_t r = r0; r < r1; ++r) {
    const int n = first[r];
    first[r] = before;
    before += n;
  }
  if (threadIdx.x == 0) placed[blockIdx.x] = all;
  __syncthreads();
  for (std::int64_t r = threadIdx.x; r < total_rows; r += kChunkThreads) {
    const int next = r + 1 < total_rows ? first[r + 1] : all;
    counts[r] = next - first[r];
  }
  // Each edge's sorted place in shared memory, then the sorted edges written
  // out in order (scattered global stores cost a sector each).
  auto rank_of = [&](std::uint32_t key, int j) {
    const unsigned* row = bits + std::int64_t(key) * words;
    int rank = __popc(row[j / 32] & ((1u << (j & 31)) - 1u));
    for (int w = 0; w < j / 32; ++w) rank += __popc(row[w]);
    return rank;
  };
  for (std::int64_t e = base + threadIdx.x; e < end; e += kChunkThreads) {
    const std::uint32_t key = keys[e];
    if (key >= total_rows) continue;
    const int j = int((e - base) / edges_per_token);
    order[first[key] + rank_of(key, j)] = std::int32_t(e - base);
  }
  __syncthreads();
  // Sorted place i holds its row's edge of rank i - first[row].
  for (int i = threadIdx.x; i < all; i += kChunkThreads) {
    const int local = order[i];
    const std::uint32_t key = keys[base + local];
    sorted_keys[base + i] = key;
    sorted_edges[base + i] = std::int32_t(base + local);
    sorted_ranks[base + i] = i - first[key];
  }
}

// Rows [32 x blockIdx.x, + 32), a warp per 16th of the chunks and a lane per
// row: chunk_counts[c, r] becomes the edges of row r in chunks before c, and
// totals[r] the row's edges. The CTA done last writes offsets[r] = the edges
// of the rows before r, r in [0, total_rows]. Loads go kGroup at a time into
// registers ahead of their use (one round trip a group, not one a value).
//   chunk_counts: [chunks, total_rows]; totals: [total_rows]; offsets: [total_rows + 1]
constexpr int kChunkScanThreads = 512;
__global__ void __launch_bounds__(kChunkScanThreads) scan_chunks(std::int32_t* chunk_counts, std::int64_t chunks,
                                                            std::int64_t total_rows, std::int32_t* totals,
                                                            std::int64_t* offsets, unsigned* done) {
  constexpr int kParts = kChunkScanThreads / 32, kGroup = 8;
  __shared__ std::int32_t part[kParts][32];
  __shared__ bool last_cta;
  const int lane = int(threadIdx.x & 31), w = int(threadIdx.x / 32);
  const std::int64_t row = std::int64_t(blockIdx.x) * 32 + lane;
  const std::int64_t per = (chunks + kParts - 1) / kParts;
  const std::int64_t c0 = w * per, c1 = c0 + per < chunks ? c0 + per : chunks;
  const bool live = row < total_rows;
  std::int32_t sum = 0;
  for (std::int64_t g = c0; g < c1; g += kGroup) {
    std::int32_t v[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) v[i] = live && g + i < c1 ? chunk_counts[(g + i) * total_rows + row] : 0;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) sum += v[i];
  }
  part[w][lane] = sum;
  __syncthreads();
  std::int32_t running = 0;
  for (int u = 0; u < w; ++u) running += part[u][lane];
  for (std::int64_t g = c0; g < c1; g += kGroup) {
    std::int32_t v[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) v[i] = live && g + i < c1 ? chunk_counts[(g + i) * total_rows + row] : 0;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      if (live && g + i < c1) chunk_counts[(g + i) * total_rows + row] = running;
      running += v[i];
    }
  }
  if (live && w == kParts - 1) totals[row] = running;
  __threadfence();  // this CTA's totals before its arrival
  __syncthreads();
  if (threadIdx.x == 0) last_cta = atomicAdd(done, 1u) + 1 == gridDim.x;
  __syncthreads();
  if (!last_cta) return;
  __threadfence();  // the other CTAs' totals, which their arrivals follow
  // A contiguous run of rows a thread, one scan over the threads.
  using Scan = cub::BlockScan<std::int64_t, kChunkScanThreads>;
  __shared__ typename Scan::TempStorage scan;
  const std::int64_t run = (total_rows + kChunkScanThreads - 1) / kChunkScanThreads;
  const std::int64_t r0 = std::int64_t(threadIdx.x) * run;
  const std::int64_t r1 = r0 + run < total_rows ? r0 + run : total_rows;
  std::int64_t mine = 0;
  for (std::int64_t g = r0; g < r1; g += kGroup) {
    std::int32_t v[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) v[i] = g + i < r1 ? __ldcg(totals + g + i) : 0;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) mine += v[i];
  }
  std::int64_t before = 0, all = 0;
  Scan(scan).ExclusiveSum(mine, before, all);
  for (std::int64_t g = r0; g < r1; g += kGroup) {
    std::int32_t v[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) v[i] = g + i < r1 ? __ldcg(totals + g + i) : 0;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      if (g + i < r1) offsets[g + i] = before;
      before += v[i];
    }
  }
  if (threadIdx.x == 0) offsets[total_rows] = all;
}

// A sorted position a thread (chunk c = i / chunk_edges, its first placed[c]
// positions hold edges): the edge's place is offsets[row] +
// chunk_counts[c, row] + rank; there it writes its token and slot.
//   sorted_keys, sorted_edges, sorted_ranks: [edges] (edge e = (t * H + h) * K + k);
//   placed: [chunks]; chunk_counts: [chunks, total_rows]; offsets: [total_rows + 1]; tokens, slots: [edges]
__global__ void __launch_bounds__(kChunkThreads) place_edges(const std::uint32_t* sorted_keys,
                                                             const std::int32_t* sorted_edges,
                                                             const std::int32_t* sorted_ranks, std::int64_t edges,
                                                             std::int64_t chunk_edges, const std::int32_t* placed,
                                                             const std::int32_t* chunk_counts,
                                                             std::int64_t total_rows, const std::int64_t* offsets,
                                                             int num_kv_heads, int topk, std::int32_t* tokens,
                                                             std::int32_t* slots) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= edges) return;
  const std::int64_t c = i / chunk_edges;
  if (i - c * chunk_edges >= placed[c]) return;
  const std::uint32_t key = sorted_keys[i];
  const std::int64_t at = offsets[key] + chunk_counts[c * total_rows + key] + sorted_ranks[i];
  const std::int32_t e = sorted_edges[i];
  tokens[at] = e / (num_kv_heads * topk);
  slots[at] = e % topk;
}

}  // namespace msa::cuda::k2q
