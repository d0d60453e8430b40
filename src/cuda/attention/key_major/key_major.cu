// The steps around the key-major launch (key_major.hpp): work items from the
// k2q plan, the device's choice, and the merge of each token's partials
// (lse-weighted, like the split merge of decode rows).
#include "cuda/attention/key_major/key_major.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cuda/attention/decode/epilogue.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/k2q/build.hpp"
#include "msa/error.hpp"

namespace msa::cuda::attention {
namespace {

constexpr int kPrepThreads = 256;

std::int64_t blocks_for(std::int64_t n, int threads = kPrepThreads) { return (n + threads - 1) / threads; }

// One warp per k2q row (KV head h, request r, block b; rows of head h are
// h * rows + row_start[r] + b) of CTA `cta`: its edges cut into items of up to
// T tokens, placed at a reserved run of the item array (stats[0] counts
// them), the lanes writing every 32nd item.
//   offsets: [kv_heads * rows + 1]; items: [max_items]; seq_lens: [num_requests]
__device__ __forceinline__ void write_items(unsigned cta, const std::int64_t* offsets, std::int64_t rows,
                                            int num_kv_heads, const std::int32_t* seq_lens, int num_requests,
                                            int tokens_per_item, KeyMajorItem* items, std::int64_t max_items,
                                            std::int64_t* stats) {
  __shared__ std::int64_t row_start[kKeyMajorMaxRequests + 1];
  for (int r = threadIdx.x; r < num_requests; r += blockDim.x)
    row_start[r + 1] = seq_lens[r] > 0 ? (std::int64_t(seq_lens[r]) + kBlockKeys - 1) / kBlockKeys : 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    row_start[0] = 0;
    for (int r = 0; r < num_requests; ++r) row_start[r + 1] += row_start[r];
  }
  __syncthreads();
  const std::int64_t row = (std::int64_t(cta) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows * num_kv_heads) return;
  const std::int64_t first = offsets[row], edges = offsets[row + 1] - first;
  if (edges <= 0) return;
  const int h = int(row / rows);
  const std::int64_t local = row - std::int64_t(h) * rows;
  int lo = 0, hi = num_requests - 1;  // the last request with row_start[r] <= local
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (row_start[mid] <= local) lo = mid;
    else hi = mid - 1;
  }
  const std::int64_t n = (edges + tokens_per_item - 1) / tokens_per_item;
  std::int64_t at = 0;
  if (lane == 0) at = std::int64_t(atomicAdd(reinterpret_cast<unsigned long long*>(stats), static_cast<unsigned long long>(n)));
  at = __shfl_sync(0xffffffffu, at, 0);
  for (std::int64_t i = lane; i < n && at + i < max_items; i += 32) {
    KeyMajorItem it;
    it.head = h;
    it.request = lo;
    it.block = int(local - row_start[lo]);
    it.edge = int(first + i * tokens_per_item);
    it.count = int(edges - i * tokens_per_item < tokens_per_item ? edges - i * tokens_per_item : tokens_per_item);
    it.pad[0] = it.pad[1] = it.pad[2] = 0;
    items[at + i] = it;
  }
}

// The (token tile, block) pairs the token-tile kernel would run: edges whose
// token falls in another tile of T tokens than the previous edge's (stats[1]),
// edges e = cta x threads + thread, then every `ctas` x threads on.
//   offsets: [kv_heads * rows + 1]; tokens: [edges]
__device__ __forceinline__ void count_tile_rounds(unsigned cta, unsigned ctas, const std::int64_t* offsets,
                                                  std::int64_t total_rows, const std::int32_t* tokens,
                                                  int tokens_per_tile, std::int64_t* stats) {
  const std::int64_t nnz = offsets[total_rows];
  long long count = 0;
  for (std::int64_t e = std::int64_t(cta) * blockDim.x + threadIdx.x; e < nnz; e += std::int64_t(ctas) * blockDim.x)
    count += e == 0 || tokens[e] / tokens_per_tile != tokens[e - 1] / tokens_per_tile;
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
  if ((threadIdx.x & 31) == 0 && count > 0)
    atomicAdd(reinterpret_cast<unsigned long long*>(stats + 1), static_cast<unsigned long long>(count));
}

// The choice (prefer_key_major, from the counts), made by the CTA of
// items_and_rounds that finishes last (stats[4] counts the CTAs done):
// stats[2] = items when key-major runs (else 0), stats[3] = 0 when it does
// (else the largest count, so that the token tiles run in full).
__device__ __forceinline__ void choose_when_last(std::int64_t* stats, std::int64_t max_items, bool always) {
  __threadfence();  // this thread's counts before its CTA's arrival
  __syncthreads();
  if (threadIdx.x != 0) return;
  const unsigned long long done = atomicAdd(reinterpret_cast<unsigned long long*>(stats + 4), 1ull);
  if (done + 1 != gridDim.x) return;
  __threadfence();  // the other CTAs' counts, which their arrivals follow
  const volatile std::int64_t* counts = stats;
  const std::int64_t items = counts[0] < max_items ? counts[0] : max_items;
  const bool key_major = prefer_key_major(counts[1], items, always);
  stats[2] = key_major ? items : 0;
  stats[3] = key_major ? 0 : std::numeric_limits<std::int64_t>::max();
}

// Both counts of the choice and the choice in one launch: CTAs [0,
// item_ctas) write the items (write_items), the others count the tile rounds
// (count_tile_rounds), and the last CTA done chooses.
__global__ void items_and_rounds(unsigned item_ctas, const std::int64_t* offsets, std::int64_t rows,
                                 int num_kv_heads, const std::int32_t* seq_lens, int num_requests,
                                 int tokens_per_item, KeyMajorItem* items, std::int64_t max_items,
                                 const std::int32_t* tokens, int tokens_per_tile, bool always, std::int64_t* stats) {
  if (blockIdx.x < item_ctas)
    write_items(blockIdx.x, offsets, rows, num_kv_heads, seq_lens, num_requests, tokens_per_item, items, max_items,
                stats);
  else
    count_tile_rounds(blockIdx.x - item_ctas, gridDim.x - item_ctas, offsets, rows * num_kv_heads, tokens,
                      tokens_per_tile, stats);
  choose_when_last(stats, max_items, always);
}

template <bool kF16>
__device__ __forceinline__ float to_float(std::uint16_t x) {
  if constexpr (kF16) return __half2float(__ushort_as_half(x));
  else return __uint_as_float(std::uint32_t(x) << 16);
}

// Row r's slot 0 among the partials (partial_out rows and partial_lse, laid
// out alike, merge_row): slot k lies k x heads further on.
__device__ __forceinline__ std::int64_t first_slot(std::int64_t row, int topk, int heads) {
  return (row / heads) * topk * heads + row % heads;
}

// One (token, query head) row on one warp: out = sum_k
// w_k o_k / sum_k w_k with w_k = exp(lse_k - max lse), lse = max + log(sum w_k);
// row r's slot k is partial_out and partial_lse row (r / heads x topk + k) x
// heads + r % heads (heads 1: [rows, topk] slots of a row together; the query
// heads: [tokens, topk, heads], a slot's heads of a token together);
// 0 and -inf when no slot has a partial; a row whose slot 0 holds +inf (a
// token tile that ran whole in a step whose last tiles split) is left as it
// is. The row is memory-bound: each half-warp takes every other slot, a lane
// 8 of the 128 dims (16-byte loads), with four slots per half in flight; the
// halves add up at the end. A slot of weight 0 is not read (its partial may
// never have been written). The warp's row `row`, whose slots' lse this lane
// read (RowLse):
//   partial_out: [rows / heads, topk, heads, 128]; partial_lse: [rows / heads, topk, heads];
//   out: [rows, 128]; lse: [rows]
struct RowLse {
  float a, b;  // slots lane and lane + 32 (-inf past topk)
};
__device__ __forceinline__ RowLse row_lse(const float* partial_lse, std::int64_t row, int topk, int heads) {
  const int lane = threadIdx.x & 31;
  const float* l = partial_lse + first_slot(row, topk, heads);
  return {lane < topk ? l[std::int64_t(lane) * heads] : -INFINITY,
          lane + 32 < topk ? l[std::int64_t(lane + 32) * heads] : -INFINITY};
}
template <bool kF16>
__device__ __forceinline__ void merge_row(std::int64_t row, RowLse slots, const std::uint16_t* partial_out, int topk,
                                          int heads, std::uint16_t* out, float* lse) {
  const int lane = threadIdx.x & 31;
  const float a = slots.a, b = slots.b;
  if (__shfl_sync(0xffffffffu, a, 0) == INFINITY) return;  // uniform over the warp
  float mx = fmaxf(a, b);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float wa = a == -INFINITY ? 0.0f : __expf(a - mx), wb = b == -INFINITY ? 0.0f : __expf(b - mx);
  float sum = wa + wb;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int half = lane >> 4, dims = 8 * (lane & 15);
  const std::uint16_t* po = partial_out + first_slot(row, topk, heads) * kDim + dims;
  const std::int64_t slot_stride = std::int64_t(heads) * kDim;
  constexpr int kInFlight = 4;  // slots per half-warp and pass
  float acc[8] = {};
  for (int k0 = 0; k0 < topk; k0 += 2 * kInFlight) {
    float w[kInFlight];
    uint4 v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      // Slots k and k ^ 1 lie on the same side of 32, so every lane passes
      // the same one of wa / wb.
      const int k = k0 + 2 * u + half;
      const float wk = __shfl_sync(0xffffffffu, k < 32 ? wa : wb, k & 31);
      w[u] = k < topk ? wk : 0.0f;
      v[u] = w[u] != 0.0f ? *reinterpret_cast<const uint4*>(po + k * slot_stride) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const std::uint32_t words[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] += w[u] * to_float<kF16>(std::uint16_t(words[e] & 0xffffu));
        acc[2 * e + 1] += w[u] * to_float<kF16>(std::uint16_t(words[e] >> 16));
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);
  if (half == 0) {
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    uint4 o;
    o.x = pack2<kF16>(acc[0] * inv, acc[1] * inv);
    o.y = pack2<kF16>(acc[2] * inv, acc[3] * inv);
    o.z = pack2<kF16>(acc[4] * inv, acc[5] * inv);
    o.w = pack2<kF16>(acc[6] * inv, acc[7] * inv);
    *reinterpret_cast<uint4*>(out + row * kDim + dims) = o;
  }
  if (lse != nullptr && lane == 0) lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

// A warp per row of [first_row, end_row).
template <bool kF16>
__global__ void merge_partials(const std::uint16_t* partial_out, const float* partial_lse, int topk, int heads,
                               std::int64_t first_row, std::int64_t end_row, std::uint16_t* out, float* lse) {
  const std::int64_t row = first_row + (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= end_row) return;
  merge_row<kF16>(row, row_lse(partial_lse, row, topk, heads), partial_out, topk, heads, out, lse);
}

// The same rows on one wave of CTAs, each warp taking every so many and
// reading its next row's lse before this row's partials, when *gate != 0: a
// step whose device chose the token tiles exits here at the cost of one
// wave, not of a CTA per eight rows.
template <bool kF16>
__global__ void merge_partials_gated(const std::uint16_t* partial_out, const float* partial_lse, int topk, int heads,
                                     std::int64_t first_row, std::int64_t end_row, std::uint16_t* out, float* lse,
                                     const std::int64_t* gate) {
  if (*gate == 0) return;
  const std::int64_t warps = std::int64_t(gridDim.x) * blockDim.x / 32;
  std::int64_t row = first_row + (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  RowLse slots = row < end_row ? row_lse(partial_lse, row, topk, heads) : RowLse{-INFINITY, -INFINITY};
  for (; row < end_row; row += warps) {
    const std::int64_t next = row + warps;
    const RowLse after = next < end_row ? row_lse(partial_lse, next, topk, heads) : RowLse{-INFINITY, -INFINITY};
    merge_row<kF16>(row, slots, partial_out, topk, heads, out, lse);
    slots = after;
  }
}

}  // namespace

void prepare_key_major(const KeyMajorBuffers& km, const AttentionSchedule& schedule, const StepView& step,
                       const AttentionArgs& args, const AttendParams& p, bool always, cudaStream_t stream,
                       const DeviceCheck& check) {
  const AttentionWorkspaceMap& l = km.map;
  const std::int64_t rows = schedule.key_major_rows;
  const int tokens_per_tile = schedule.tile_tokens;  // the token tiles' (their rounds, for the choice)
  const int tokens_per_item = key_major_item_tokens(p.group);
  MSA_CHECK(step.num_requests <= kKeyMajorMaxRequests, "attend: key-major step with ", step.num_requests,
            " requests, at most ", kKeyMajorMaxRequests);
  const std::int64_t total_rows = rows * p.num_kv_heads;
  MSA_CUDA_CHECK(cudaMemsetAsync(km.stats(), 0, kKeyMajorStats * sizeof(std::int64_t), stream));
  K2QDevicePlan plan;
  plan.offsets = reinterpret_cast<std::int64_t*>(km.base + l.k2q_offsets);
  plan.tokens = km.tokens();
  plan.slots = km.slots();
  plan.counts = reinterpret_cast<std::int32_t*>(km.base + l.k2q_counts);
  // The partials no edge writes: -inf lse, left out of the merge.
  const K2QUnplacedLse unplaced{km.partial_lse(), p.group};
  build_k2q_with(step, args.topk, p.num_kv_heads, rows, plan, km.base + l.k2q_scratch, l.k2q_scratch_bytes, stream,
                 check, unplaced);
  const int sms = device_sm_count();  // grid-stride passes: a few blocks per SM
  const auto item_ctas = unsigned(blocks_for(total_rows * 32));
  items_and_rounds<<<dim3(item_ctas + unsigned(4 * sms)), kPrepThreads, 0, stream>>>(
      item_ctas, plan.offsets, rows, p.num_kv_heads, p.seq_lens, step.num_requests, tokens_per_item, km.items(),
      l.km_max_items, km.tokens(), tokens_per_tile, always, km.stats());
  MSA_CUDA_CHECK_LAUNCH();
}

namespace {

// CTAs of merge_partials_gated resident on one SM, asked once per instance.
template <bool kF16>
int merge_wave_blocks() {
  static const int blocks = [] {
    int n = 0;
    MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, merge_partials_gated<kF16>, kPrepThreads, 0));
    return n > 0 ? n : 1;
  }();
  return blocks;
}

// Rows [first_row, end_row) of out / lse (heads: merge_row): a warp per row,
// or, with a gate, one wave of CTAs that runs them only when *gate != 0.
template <bool kF16>
void merge_rows_as(const std::uint16_t* po, const float* partial_lse, int slots, int heads, std::int64_t first_row,
                   std::int64_t end_row, std::uint16_t* out, float* lse, const std::int64_t* gate,
                   cudaStream_t stream) {
  const std::int64_t per_row = blocks_for((end_row - first_row) * 32);
  if (gate == nullptr) {
    merge_partials<kF16><<<dim3(unsigned(per_row)), kPrepThreads, 0, stream>>>(po, partial_lse, slots, heads,
                                                                              first_row, end_row, out, lse);
  } else {
    const std::int64_t wave = std::int64_t(merge_wave_blocks<kF16>()) * device_sm_count();
    merge_partials_gated<kF16><<<dim3(unsigned(std::min(per_row, wave))), kPrepThreads, 0, stream>>>(
        po, partial_lse, slots, heads, first_row, end_row, out, lse, gate);
  }
  MSA_CUDA_CHECK_LAUNCH();
}

void merge_rows(const void* partial_out, const float* partial_lse, int slots, int heads, std::int64_t first_row,
                std::int64_t end_row, const AttendParams& p, const std::int64_t* gate, cudaStream_t stream) {
  if (end_row <= first_row) return;
  const auto* po = static_cast<const std::uint16_t*>(partial_out);
  auto* out = static_cast<std::uint16_t*>(p.out);
  if (p.out_fp16) merge_rows_as<true>(po, partial_lse, slots, heads, first_row, end_row, out, p.lse, gate, stream);
  else merge_rows_as<false>(po, partial_lse, slots, heads, first_row, end_row, out, p.lse, gate, stream);
}

}  // namespace

void combine_key_major(const KeyMajorBuffers& km, const AttendParams& p, bool always, cudaStream_t stream) {
  merge_rows(km.partial_out(), km.partial_lse(), p.topk.topk, p.num_q_heads, 0,
             std::int64_t(p.num_tokens) * p.num_q_heads, p, always ? nullptr : km.key_major_gate(), stream);
}

void combine_tile_splits(const AttendParams& p, cudaStream_t stream) {
  merge_rows(p.tile_partial_out, p.tile_partial_lse, p.tile_splits, 1,
             std::int64_t(p.num_decode_tokens) * p.num_q_heads, std::int64_t(p.num_tokens) * p.num_q_heads, p, nullptr,
             stream);
}

}  // namespace msa::cuda::attention
