// One warp's top-k threshold over a row of scores, in the selection order of
// msa/select.hpp (higher score first, NaN lowest, ties to the lower block id).
// Shared by the indexer's selection (indexer/select.cu) and the context-
// parallel candidates (cp/candidates.cu); header-only device code.
//
// Scores become order-preserving 32-bit keys. threshold finds the key T of the
// pick-th best candidate and how many candidates with key T win; an ascending
// pass over the candidates then takes every key above T and the first of the
// keys equal to T (the lowest candidate indices, so the lowest ids when ids
// ascend with the index), deciding each lane's candidate with
// Threshold::takes.
//
// threshold first bounds T from below without atomics: each lane's largest
// key stands for a distinct candidate, so the pick-th largest of the 32 lane
// maxima is at most T. The few candidates at or above that bound (about 20 of
// a 1,000-block row for pick 15, scores of any spread) are gathered in shared
// memory and T is ranked among them exactly. Where they are too many (pick
// over 32, heavy ties), radix_threshold finds T 8 bits a pass with a
// histogram in shared memory (the key prefix of T and how many candidates
// with that prefix win): its first passes meet scores of similar magnitude on
// a few bins, whose shared-memory atomics serialize.
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

// Most candidates gathered by the lower-bound filter of threshold(), in the
// histogram's shared memory.
inline constexpr int kMaxGathered = 128;

// The pick-th largest of the warp's 32 values v (pick <= 32; 0 < pick), in
// every lane.
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

// T and how many T-keyed candidates win, from the `count` gathered keys that
// hold every key >= T (at least pick of them): the gathered key whose rank in
// (key descending, index ascending) order is pick - 1 is T. Lane l ranks
// gathered keys l, l + 32, ...; the one that finds T returns true and sets th.
//   gathered: [count] shared memory
__device__ __forceinline__ bool rank_gathered(const std::uint32_t* gathered, std::int32_t count, std::int32_t pick,
                                              int lane, Threshold& th) {
  bool found = false;
  for (std::int32_t j = lane; j < count; j += 32) {
    const std::uint32_t v = gathered[j];
    std::int32_t above = 0, before = 0;
    for (std::int32_t i = 0; i < count; ++i) {
      const std::uint32_t o = gathered[i];
      above += o > v ? 1 : 0;
      before += (o == v && i < j) ? 1 : 0;
    }
    if (above + before == pick - 1) {
      th = Threshold{v, 0, pick - above};
      found = true;
    }
  }
  return found;
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

// The lower-bound filter of threshold() (pick <= 32, count > pick): false
// when more than kMaxGathered candidates reach the bound; otherwise true,
// with th set in every lane. Every lane of the warp calls it together.
//   buf: [kMaxGathered] shared memory
template <class KeyAt>
__device__ __forceinline__ bool filtered_threshold(const KeyAt& key_at, std::int32_t count, std::int32_t pick,
                                                   std::uint32_t* buf, int lane, Threshold& th) {
  std::uint32_t most = 0;  // NaN's key: a lane without candidates bounds nothing
  for (std::int32_t i = lane; i < count; i += 32) most = max(most, key_at(i));
  const std::uint32_t bound = warp_kth_largest(most, pick, lane);
  std::int32_t gathered = 0;
  for (std::int32_t base = 0; base < count; base += 32) {
    const std::int32_t i = base + lane;
    const std::uint32_t k = i < count ? key_at(i) : 0u;
    const bool in = i < count && k >= bound;
    const std::uint32_t ins = __ballot_sync(0xffffffffu, in);
    const std::int32_t at = gathered + __popc(ins & lanes_below(lane));
    if (in && at < kMaxGathered) buf[at] = k;
    gathered += __popc(ins);
  }
  __syncwarp();
  if (gathered > kMaxGathered) return false;
  Threshold mine;
  const bool found = rank_gathered(buf, gathered, pick, lane, mine);
  const int src = __ffs(__ballot_sync(0xffffffffu, found)) - 1;
  th = Threshold{__shfl_sync(0xffffffffu, mine.prefix, src), 0, __shfl_sync(0xffffffffu, mine.need, src)};
  __syncwarp();  // buf is read by every lane before it is written again
  return true;
}

// radix_threshold's winners (not necessarily its prefix and shift), through
// the lower-bound filter where it applies. Every lane of the warp calls it
// together.
//   hist: [kBins] this warp's histogram in shared memory
template <class KeyAt>
__device__ __forceinline__ Threshold threshold(const KeyAt& key_at, std::int32_t count, std::int32_t pick,
                                               std::uint32_t* hist, int lane) {
  Threshold th;
  if (pick <= 32 && filtered_threshold(key_at, count, pick, hist, lane, th)) return th;
  return radix_threshold(key_at, count, pick, hist, lane);
}

// The same for a whole thread block: warp 0 tries the filter over all the
// candidates (a lane's maximum over count / 32 of them bounds better than over
// count / blockDim), the block's radix select runs where it fails. Every
// thread of the block calls it together.
//   hist: [kBins] the block's histogram in shared memory
//   decided: the block's copy of the outcome in shared memory
template <class KeyAt>
__device__ __forceinline__ Threshold block_threshold(const KeyAt& key_at, std::int32_t count, std::int32_t pick,
                                                     std::uint32_t* hist, Threshold* decided) {
  if (pick <= 32) {
    if (threadIdx.x < 32) {
      Threshold th;
      const bool ok = filtered_threshold(key_at, count, pick, hist, static_cast<int>(threadIdx.x), th);
      if (threadIdx.x == 0) *decided = ok ? th : Threshold{0, 0, -1};
    }
    __syncthreads();
    const Threshold th = *decided;
    __syncthreads();  // read by every thread before it is written again
    if (th.need >= 0) return th;
  }
  return block_radix_threshold(key_at, count, pick, hist, decided);
}

}  // namespace msa::cuda::warp
