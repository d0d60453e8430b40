// One warp's top-k threshold over a row of scores, in the selection order of
// msa/select.hpp (higher score first, NaN lowest, ties to the lower block id).
// Shared by the indexer's selection (indexer/select.cu) and the context-
// parallel candidates (cp/candidates.cu); header-only device code.
//
// Scores become order-preserving 32-bit keys. A row's winners are the keys
// above a threshold key T and the first `need` of the keys equal to T (the
// lowest candidate indices, so the lowest ids when ids ascend with the
// index); Threshold::takes decides a lane's candidate in an ascending pass.
//
// Two ways to T. The lower-bound filter (pick <= 32): each lane's largest key
// stands for a distinct candidate, so the pick-th largest of the 32 lane
// maxima is at most T; the few candidates that reach it (about 20 of a
// 1,000-block row for pick 15 when scores are independent draws) are gathered
// in shared memory in ascending order, T is ranked among them exactly, and the winners
// are taken from them. The radix select, where the filter gathers too many
// (pick over 32, heavy ties): 8 bits a pass with a histogram in shared memory,
// the key prefix of T and how many candidates with that prefix win, then an
// ascending pass over every candidate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace msa::cuda::warp {

// Histogram bins of one radix pass (8 bits).
inline constexpr int kBins = 256;

// Order-preserving key of a score under select::ranks_before, ids aside:
// a ranks before b iff key(a) > key(b). NaN maps to 0, below every number
// (-inf maps to 0x007FFFFF); -0 and +0 map to the same key.
__device__ __forceinline__ std::uint32_t order_key(float f) {
  if (f != f) return 0u;
  std::uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Bit mask of the lanes below `lane`.
__device__ __forceinline__ std::uint32_t lanes_below(int lane) { return (1u << lane) - 1u; }

// The winners of a row: the candidates whose key >> shift is > prefix, plus
// the first `need` (in candidate order) of those whose key >> shift == prefix.
struct Threshold {
  std::uint32_t prefix = 0;
  int shift = 0;
  std::int32_t need = 0;

  // Whether this lane's candidate wins, in an ascending pass that looks at 32
  // candidates at a time: `in` says the lane holds one, with order key `key`;
  // ties_seen counts the prefix-equal candidates of the earlier steps and is
  // advanced past this step's. Every lane of the warp calls it together.
  __device__ __forceinline__ bool takes(bool in, std::uint32_t key, int lane,
                                        std::int32_t& ties_seen) const {
    const std::uint32_t k = in ? key >> shift : 0u;
    const bool tie = in && k == prefix;
    const std::uint32_t ties = __ballot_sync(0xffffffffu, tie);
    const bool take = (in && k > prefix) || (tie && ties_seen + __popc(ties & lanes_below(lane)) < need);
    ties_seen += __popc(ties);
    return take;
  }
};

// One radix pass's decision, taken by one warp over a filled histogram: the
// digit of the want-th best key among the prefix's candidates, how many of
// them rank above that digit, and how many share it.
struct Digit {
  std::uint32_t digit = 0, above = 0, equal = 0;
};
__device__ __forceinline__ Digit pick_digit(const std::uint32_t* hist, std::uint32_t want, int lane) {
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
  // The lane whose bins hold the want-th best key.
  const int src = __ffs(__ballot_sync(0xffffffffu, excl < want && want <= incl)) - 1;
  Digit d{0, excl, 0};
  if (lane == src) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (d.equal != 0) continue;
      if (d.above + cnt[j] >= want) {
        d.digit = kBins - 1 - 8 * lane - j;
        d.equal = cnt[j];
      } else {
        d.above += cnt[j];
      }
    }
  }
  d.digit = __shfl_sync(0xffffffffu, d.digit, src);
  d.above = __shfl_sync(0xffffffffu, d.above, src);
  d.equal = __shfl_sync(0xffffffffu, d.equal, src);
  return d;
}

// Radix select of the `pick` best of `count` candidates (count > pick >= 1),
// candidate i having the order key key_at(i); stops as soon as every candidate
// of the prefix wins. Every lane of the warp calls it together.
//   hist: [kBins] this warp's histogram in shared memory
template <class KeyAt>
__device__ __forceinline__ Threshold radix_threshold(const KeyAt& key_at, std::int32_t count,
                                                     std::int32_t pick, std::uint32_t* hist,
                                                     int lane) {
  std::uint32_t prefix = 0;
  std::int32_t need = pick;
  for (int shift = 24;; shift -= 8) {
    for (int i = lane; i < kBins; i += 32) hist[i] = 0;
    __syncwarp();
    for (std::int32_t i = lane; i < count; i += 32) {
      const std::uint32_t k = key_at(i);
      if (shift == 24 || (k >> (shift + 8)) == prefix) atomicAdd(&hist[(k >> shift) & 0xFFu], 1u);
    }
    __syncwarp();
    const Digit d = pick_digit(hist, static_cast<std::uint32_t>(need), lane);
    need -= static_cast<std::int32_t>(d.above);
    prefix = (prefix << 8) | d.digit;
    __syncwarp();  // the histogram is cleared again by the next pass
    if (d.equal == static_cast<std::uint32_t>(need) || shift == 0) return Threshold{prefix, shift, need};
  }
}

// The same threshold found by a whole thread block (blockDim.x a multiple of
// 32), for long rows: every thread counts into one histogram, warp 0 decides.
// Every thread of the block calls it together.
//   hist: [kBins] the block's histogram in shared memory
//   decided: the block's copy of the pass's outcome in shared memory
template <class KeyAt>
__device__ __forceinline__ Threshold block_radix_threshold(const KeyAt& key_at, std::int32_t count,
                                                           std::int32_t pick, std::uint32_t* hist,
                                                           Threshold* decided) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31;
  std::uint32_t prefix = 0;
  std::int32_t need = pick;
  for (int shift = 24;; shift -= 8) {
    for (int i = tid; i < kBins; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (std::int32_t i = tid; i < count; i += blockDim.x) {
      const std::uint32_t k = key_at(i);
      if (shift == 24 || (k >> (shift + 8)) == prefix) atomicAdd(&hist[(k >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (tid < 32) {
      const Digit d = pick_digit(hist, static_cast<std::uint32_t>(need), lane);
      const std::int32_t left = need - static_cast<std::int32_t>(d.above);
      // need < 0 marks the last pass.
      const bool last = d.equal == static_cast<std::uint32_t>(left) || shift == 0;
      if (lane == 0) *decided = Threshold{(prefix << 8) | d.digit, shift, last ? -1 - left : left};
    }
    __syncthreads();
    const Threshold t = *decided;
    __syncthreads();  // read by every thread before warp 0 writes it again
    prefix = t.prefix;
    if (t.need < 0) return Threshold{prefix, shift, -1 - t.need};
    need = t.need;
  }
}

// ---- the lower-bound filter -------------------------------------------------------
// Most candidates gathered: keys in hist[0, kMaxGathered), their candidate
// indices in hist[kMaxGathered, 2 kMaxGathered).
inline constexpr int kMaxGathered = kBins / 2;

// The largest key of candidates lane, lane + 32, ... (0, NaN's key, for none).
template <class KeyAt>
__device__ __forceinline__ std::uint32_t lane_max(const KeyAt& key_at, std::int32_t count, int lane) {
  std::uint32_t most = 0;
  for (std::int32_t i = lane; i < count; i += 32) most = max(most, key_at(i));
  return most;
}

// The pick-th largest of the warp's 32 values v (0 < pick <= 32), in every
// lane: 32 independent shuffles, a short dependent chain for a lone warp.
__device__ __forceinline__ std::uint32_t warp_kth_largest(std::uint32_t v, std::int32_t pick, int lane) {
  // Rank of each lane's value in (value descending, lane ascending) order.
  std::int32_t rank = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const std::uint32_t o = __shfl_sync(0xffffffffu, v, j);
    rank += (o > v || (o == v && j < lane)) ? 1 : 0;
  }
  const std::uint32_t at = __ballot_sync(0xffffffffu, rank == pick - 1);
  return __shfl_sync(0xffffffffu, v, __ffs(at) - 1);
}

// A bitonic sort of the warp's 32 values descending (15 dependent exchange
// steps), lane l ending with the (l + 1)-th largest; larger / smaller pick
// from two values, so that the same network sorts 16-bit halves apart.
template <class Larger, class Smaller>
__device__ __forceinline__ std::uint32_t warp_sort_descending(std::uint32_t v, int lane, const Larger& larger,
                                                              const Smaller& smaller) {
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const std::uint32_t o = __shfl_xor_sync(0xffffffffu, v, j);
      // Runs of k lanes sorted descending where lane & k is clear, ascending
      // elsewhere; the last (k = 32) run is the whole warp, descending.
      const bool keep_larger = ((lane & j) == 0) == ((lane & k) == 0);
      v = keep_larger ? larger(v, o) : smaller(v, o);
    }
  }
  return v;
}

// warp_kth_largest by the sort: fewer instructions, for warps that share an
// SM's issue slots.
__device__ __forceinline__ std::uint32_t warp_kth_largest_sorted(std::uint32_t v, std::int32_t pick, int lane) {
  const auto larger = [](std::uint32_t a, std::uint32_t b) { return max(a, b); };
  const auto smaller = [](std::uint32_t a, std::uint32_t b) { return min(a, b); };
  return __shfl_sync(0xffffffffu, warp_sort_descending(v, lane, larger, smaller), pick - 1);
}

// The two 16-bit halves of the warp's values sorted descending each on its own
// (max / min of u16 pairs, one instruction each on sm_90): lane l ends with
// the (l + 1)-th largest high half and the (l + 1)-th largest low half.
__device__ __forceinline__ std::uint32_t warp_sort_halves(std::uint32_t v, int lane) {
  const auto larger = [](std::uint32_t a, std::uint32_t b) { return __vmaxu2(a, b); };
  const auto smaller = [](std::uint32_t a, std::uint32_t b) { return __vminu2(a, b); };
  return warp_sort_descending(v, lane, larger, smaller);
}

// Gathers, in ascending index order, the candidates whose key reaches the
// pick-th largest of the lanes' maxima `most` (lane_max): each lane's maximum
// is a distinct candidate, so at least pick candidates reach that bound, and
// every winner does. Returns how many there are (more than kMaxGathered: only
// the first kMaxGathered are stored). Every lane of the warp calls it
// together (0 < pick <= 32 < count).
//   hist: [kBins] shared memory (keys, then indices)
template <class KeyAt>
__device__ __forceinline__ std::int32_t gather_above_bound(const KeyAt& key_at, std::int32_t count,
                                                           std::int32_t pick, std::uint32_t most,
                                                           std::uint32_t* hist, int lane) {
  const std::uint32_t bound = warp_kth_largest(most, pick, lane);
  std::int32_t gathered = 0;
  for (std::int32_t base = 0; base < count; base += 32) {
    const std::int32_t i = base + lane;
    const std::uint32_t k = i < count ? key_at(i) : 0u;
    const bool in = i < count && k >= bound;
    const std::uint32_t ins = __ballot_sync(0xffffffffu, in);
    const std::int32_t at = gathered + __popc(ins & lanes_below(lane));
    if (in && at < kMaxGathered) {
      hist[at] = k;
      hist[kMaxGathered + at] = static_cast<std::uint32_t>(i);
    }
    gathered += __popc(ins);
  }
  __syncwarp();
  return gathered;
}

// T and how many T-keyed candidates win, from the `gathered` keys of hist
// (gather_above_bound, at most kMaxGathered): the key whose rank in (key
// descending, place ascending) order is pick - 1 is T. Every lane of the warp
// calls it together.
__device__ __forceinline__ Threshold rank_gathered(const std::uint32_t* hist, std::int32_t gathered,
                                                   std::int32_t pick, int lane) {
  Threshold th;
  bool found = false;
  for (std::int32_t j = lane; j < gathered; j += 32) {
    const std::uint32_t v = hist[j];
    std::int32_t above = 0, before = 0;
    for (std::int32_t i = 0; i < gathered; ++i) {
      const std::uint32_t o = hist[i];
      above += o > v ? 1 : 0;
      before += (o == v && i < j) ? 1 : 0;
    }
    if (above + before == pick - 1) {
      th = Threshold{v, 0, pick - above};
      found = true;
    }
  }
  const int src = __ffs(__ballot_sync(0xffffffffu, found)) - 1;
  return Threshold{__shfl_sync(0xffffffffu, th.prefix, src), 0, __shfl_sync(0xffffffffu, th.need, src)};
}

// The winners among the gathered candidates, in ascending index order:
// take(place, index) for place 0, 1, ... Every lane of the warp calls it
// together.
template <class Take>
__device__ __forceinline__ void take_gathered(const std::uint32_t* hist, std::int32_t gathered, const Threshold& th,
                                              int lane, const Take& take) {
  std::int32_t written = 0, ties_seen = 0;
  for (std::int32_t base = 0; base < gathered; base += 32) {
    const std::int32_t j = base + lane;
    const bool in = j < gathered;
    const bool wins = th.takes(in, in ? hist[j] : 0u, lane, ties_seen);
    const std::uint32_t all = __ballot_sync(0xffffffffu, wins);
    if (wins) take(written + __popc(all & lanes_below(lane)), static_cast<std::int32_t>(hist[kMaxGathered + j]));
    written += __popc(all);
  }
}

// radix_threshold's winners (not necessarily its prefix and shift), through
// the lower-bound filter where it applies (pick <= 32 and at most
// kMaxGathered candidates reach the bound). Every lane of the warp calls it
// together.
//   hist: [kBins] this warp's histogram in shared memory
template <class KeyAt>
__device__ __forceinline__ Threshold threshold(const KeyAt& key_at, std::int32_t count, std::int32_t pick,
                                               std::uint32_t* hist, int lane) {
  if (pick <= 32) {
    const std::int32_t gathered = gather_above_bound(key_at, count, pick, lane_max(key_at, count, lane), hist, lane);
    if (gathered <= kMaxGathered) {
      const Threshold th = rank_gathered(hist, gathered, pick, lane);
      __syncwarp();  // hist is read by every lane before it is written again
      return th;
    }
  }
  return radix_threshold(key_at, count, pick, hist, lane);
}

}  // namespace msa::cuda::warp
