// (b) The merge of every rank's candidates into the global top-k, bit-identical
// to msa::cp::merge_candidates / cpu::select_row, and (c) the owned-entries
// filter of a top-k buffer.
//
// Merge: one warp per row (t, h). The forced blocks are known to every rank and
// are written first; the num_ranks * topk candidates become 64-bit keys
// (score order key, then the complement of the id so that ties go to the lower
// id), up to 32 per lane in registers. Each of the at most topk rounds takes
// the warp's largest key and drops every candidate of that block, so the row
// never holds an id twice whatever the input. The chosen ids are sorted
// ascending by a rank count; merge_topk's form writes the rank's owned entries
// in the same pass.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/check.cuh"
#include "cuda/common/warp_select.cuh"
#include "cuda/cp/cp_checks.hpp"
#include "cuda/cp/cp_device.cuh"
#include "cuda/cp/merge.hpp"
#include "msa/common.hpp"
#include "msa/cuda_cp.hpp"
#include "msa/error.hpp"
#include "msa/select.hpp"

namespace msa::cuda::cp {
namespace {

using detail::kWarps;
using warp::lanes_below;
using warp::order_key;

struct MergeParams : detail::RowParams {
  const Candidate* candidates = nullptr;  // [num_ranks, num_tokens, num_heads, topk]
  TopkView out;                           // [num_tokens, num_heads, topk]
  TopkView owned;  // [num_tokens, num_heads, topk] the entries `rank` owns; data null: not written
  std::int32_t rank = 0;
};

// The block of a nonzero key.
__device__ __forceinline__ std::int32_t key_block(std::uint64_t key) {
  return static_cast<std::int32_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(key));
}

template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32) merge_kernel(const MergeParams p) {
  __shared__ std::int32_t chosen_all[kWarps][kMaxTopk];
  __shared__ bool mine_all[kWarps][kMaxTopk];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.num_rows) return;  // whole warp; no block-wide barrier below
  const auto t = static_cast<std::int32_t>(row / p.num_heads);
  const auto h = static_cast<std::int32_t>(row - std::int64_t(t) * p.num_heads);
  const std::int32_t pos = p.step.position(t);
  const std::int32_t last = pos < 0 ? -1 : min(pos / kBlockSize, p.max_blocks - 1);
  const std::int32_t K = p.topk;
  std::int32_t* out = p.out.row(t, h);  // [topk]
  const bool own = p.owned.data != nullptr;
  std::int32_t* owned = own ? p.owned.row(t, h) : nullptr;  // [topk]
  if (last < 0) {
    for (std::int32_t k = lane; k < K; k += 32) {
      out[k] = -1;
      if (own) owned[k] = -1;
    }
    return;
  }
  std::int32_t* chosen = chosen_all[warp];  // [topk]
  const std::int32_t valid = select::num_valid(last, K);

  // Forced blocks, ascending: [0, head_end) and [tail_begin, last].
  const std::int32_t head_end = min(p.init_blocks, last + 1);
  const std::int32_t tail_begin = max(head_end, last - p.local_blocks + 1);
  const std::int32_t forced = min(head_end + max(0, last - tail_begin + 1), valid);
  for (std::int32_t i = lane; i < forced; i += 32)
    chosen[i] = i < head_end ? i : tail_begin + (i - head_end);

  // Candidates as keys; 0 = none (a valid key is never 0: its low word is
  // 0xFFFFFFFF - id > 0).
  const std::int32_t total = p.sharding.num_ranks * K;
  const std::int64_t rank_stride = p.num_rows * K;  // elements between ranks' slices
  const Candidate* cand = p.candidates + row * K;
  std::uint64_t key[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    key[j] = 0;
    const std::int32_t e = lane + 32 * j;
    if (e >= total) continue;
    const std::int32_t r = e / K;
    const Candidate c = cand[r * rank_stride + (e - r * K)];
    if (c.block < 0 || c.block > last ||
        select::is_forced(c.block, last, p.init_blocks, p.local_blocks) ||
        p.sharding.owner(c.block) != r)
      continue;
    key[j] = (std::uint64_t(order_key(c.score)) << 32) |
             (0xFFFFFFFFu - static_cast<std::uint32_t>(c.block));
  }

  // Rounds: the best remaining key wins; every candidate of its block leaves.
  std::int32_t taken = 0;
  for (; forced + taken < valid; ++taken) {
    std::uint64_t best = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) best = key[j] > best ? key[j] : best;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) {
      const std::uint64_t o = __shfl_xor_sync(0xffffffffu, best, m);
      best = o > best ? o : best;
    }
    if (best == 0) break;  // no candidate left
    const std::int32_t b = key_block(best);
    if (lane == 0) chosen[forced + taken] = b;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      if (key[j] != 0 && key_block(key[j]) == b) key[j] = 0;
  }
  __syncwarp();

  // Ascending ids (all distinct), then -1; the owned ones in the same order
  // into `owned`, then -1.
  const std::int32_t n = forced + taken;
  bool* mine = mine_all[warp];  // [topk]
  if (own) {
    for (std::int32_t j = lane; j < n; j += 32) mine[j] = p.sharding.owner(chosen[j]) == p.rank;
    __syncwarp();
  }
  std::int32_t owned_n = 0;
  for (std::int32_t base = 0; base < n; base += 32) {
    const std::int32_t j = base + lane;
    const bool in = j < n;
    const std::int32_t v = in ? chosen[j] : 0;
    std::int32_t place = 0, owned_place = 0;
    if (in) {
      for (std::int32_t i = 0; i < n; ++i) {
        const bool before = chosen[i] < v;
        place += before ? 1 : 0;
        owned_place += before && own && mine[i] ? 1 : 0;
      }
      out[place] = v;
    }
    const bool keep = in && own && mine[j];
    if (keep) owned[owned_place] = v;
    owned_n += __popc(__ballot_sync(0xffffffffu, keep));
  }
  for (std::int32_t k = n + lane; k < K; k += 32) out[k] = -1;
  if (own)
    for (std::int32_t k = owned_n + lane; k < K; k += 32) owned[k] = -1;
}

struct OwnedParams {
  TopkView in;   // [num_tokens, num_heads, topk]
  TopkView out;  // [num_tokens, num_heads, topk]; may be `in`
  std::int32_t num_heads = 0;
  Sharding sharding;
  std::int32_t rank = 0;
  std::int64_t num_rows = 0;
};

// One warp per row; topk <= 64 entries, two per lane, all read before any write.
__global__ void __launch_bounds__(kWarps * 32) owned_kernel(const OwnedParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + warp;
  if (row >= p.num_rows) return;
  const std::int64_t t = row / p.num_heads, h = row - t * p.num_heads;
  const std::int32_t K = p.in.topk;
  const std::int32_t* in = p.in.row(t, h);  // [topk]
  std::int32_t* out = p.out.row(t, h);      // [topk]
  const std::int32_t v0 = lane < K ? in[lane] : -1;
  const std::int32_t v1 = lane + 32 < K ? in[lane + 32] : -1;
  const bool keep0 = v0 >= 0 && p.sharding.owner(v0) == p.rank;
  const bool keep1 = v1 >= 0 && p.sharding.owner(v1) == p.rank;
  const std::uint32_t m0 = __ballot_sync(0xffffffffu, keep0);  // every lane has read its entries
  const std::uint32_t m1 = __ballot_sync(0xffffffffu, keep1);
  const std::int32_t n0 = __popc(m0), n = n0 + __popc(m1);
  if (keep0) out[__popc(m0 & lanes_below(lane))] = v0;
  if (keep1) out[n0 + __popc(m1 & lanes_below(lane))] = v1;
  for (std::int32_t k = n + lane; k < K; k += 32) out[k] = -1;
}

unsigned row_blocks(std::int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

void merge_candidates(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                      const Candidate* candidates, const TopkView& out, Stream stream) {
  detail::merge_and_own(step, shape, sharding, 0, candidates, out, TopkView{}, stream);
}

namespace detail {

void merge_and_own(const StepView& step, const SelectShape& shape, const Sharding& sharding,
                   std::int32_t rank, const Candidate* candidates, const TopkView& out,
                   const TopkView& owned, Stream stream) {
  const char* fn = owned.data == nullptr ? "cp::merge_candidates" : "cp::merge_topk";
  detail::check_select(fn, step, shape);
  detail::check_sharding(fn, sharding, rank);
  MSA_CHECK(out.topk == shape.topk, fn, ": out.topk = ", out.topk, " but topk = ", shape.topk);
  MSA_CHECK(owned.data == nullptr || owned.topk == shape.topk, fn, ": owned.topk = ", owned.topk,
            " but topk = ", shape.topk);
  const std::int64_t total = std::int64_t(sharding.num_ranks) * shape.topk;
  MSA_CHECK(total <= kMaxMergeCandidates, fn, ": num_ranks * topk = ", sharding.num_ranks, " * ",
            shape.topk, " = ", total, " exceeds ", kMaxMergeCandidates);
  if (step.num_tokens == 0) return;
  MSA_CHECK(candidates != nullptr, fn, ": candidates is null");
  MSA_CHECK(out.data != nullptr, fn, ": out.data is null");
  MergeParams p;
  static_cast<detail::RowParams&>(p) = detail::row_params(step, shape, sharding);
  p.candidates = candidates;
  p.out = out;
  p.owned = owned;
  p.rank = rank;
  const auto s = static_cast<cudaStream_t>(stream);
  if (total <= 64) {
    merge_kernel<2><<<row_blocks(p.num_rows), kWarps * 32, 0, s>>>(p);
  } else if (total <= 256) {
    merge_kernel<8><<<row_blocks(p.num_rows), kWarps * 32, 0, s>>>(p);
  } else {
    merge_kernel<32><<<row_blocks(p.num_rows), kWarps * 32, 0, s>>>(p);
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace detail

void owned_entries(std::int32_t num_tokens, std::int32_t num_kv_heads, const TopkView& in,
                   const Sharding& sharding, std::int32_t rank, const TopkView& out,
                   Stream stream) {
  const char* fn = "cp::owned_entries";
  detail::check_sharding(fn, sharding, rank);
  MSA_CHECK(num_tokens >= 0 && num_kv_heads >= 1, fn, ": num_tokens = ", num_tokens,
            ", num_kv_heads = ", num_kv_heads, " (need >= 0 and >= 1)");
  MSA_CHECK(in.topk >= 1 && in.topk <= kMaxTopk, fn, ": in.topk = ", in.topk, " is outside [1, ",
            kMaxTopk, "]");
  MSA_CHECK(out.topk == in.topk, fn, ": out.topk = ", out.topk, " but in.topk = ", in.topk);
  if (num_tokens == 0) return;
  MSA_CHECK(in.data != nullptr && out.data != nullptr, fn, ": in.data / out.data is null");
  OwnedParams p;
  p.in = in;
  p.out = out;
  p.num_heads = num_kv_heads;
  p.sharding = sharding;
  p.rank = rank;
  p.num_rows = std::int64_t(num_tokens) * num_kv_heads;
  owned_kernel<<<row_blocks(p.num_rows), kWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::cp
