// The staged pre-attention kernel: whole runs of qkv rows moved by the copy
// engine, for long steps whose rows and outputs start on 16 bytes (the launch
// checks and chooses).
//
// Work: chunks of (tile of kTileTokens tokens, run of up to chunk_heads heads).
// A chunk's rows are kTileTokens contiguous pieces of qkv (one per token), so
// one bulk copy each brings them into a stage of shared memory: the reads are
// long sequential runs, as a copy's are, and no lane spends instructions on
// addresses or copies. A persistent grid; each CTA takes an equal contiguous
// run of chunks. In a CTA one producer warp fills kStages stages ahead
// (mbarrier `full`), and kConsumerWarps warps visit every chunk in turn,
// taking its steps (one head of the tile's four tokens each, process_item,
// item.cuh) one at a time from the stage's counter in shared memory, so that
// a warp held up by a costly head (K and V into an nvfp4 cache) takes fewer of
// them; each consumer thread marks the stage done (`empty`) when the chunk
// has no step left for it. A token's position and slots are the same for all
// of a chunk's heads: the producer reads them into the stage beside the rows.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/pre_attention/item.cuh"

namespace msa::cuda::pre_detail::staged {

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // the consumers and one producer warp
constexpr int kStages = 3;
constexpr int kMaxChunkHeads = 20;              // a stage's heads per token
constexpr int kMinChunkHeads = kConsumerWarps;  // a step for every consumer warp
constexpr int kHeadBytes = kHeadDim * 2;  // one head of a 16-bit qkv row
constexpr int kStageBytes = kTileTokens * kMaxChunkHeads * kHeadBytes;
// 3 CTAs per SM: 27 warps (ptxas keeps the kernel within 72 registers), and
// 3 x 63 KB of shared memory.
constexpr int kMinBlocks = 3;

// A token's values shared by every head of a chunk (zeros past the last token).
struct TokenValues {
  std::int64_t position = 0;
  std::int64_t slot = -1;
  std::int64_t index_slot = -1;
};

struct Smem {
  Gains gains;
  alignas(128) std::uint8_t stage[kStages][kStageBytes];  // [token][chunk_heads][256 B]
  TokenValues values[kStages][kTileTokens];
  std::uint64_t full[kStages];
  std::uint64_t empty[kStages];
  std::uint32_t taken[kStages];  // steps of the stage's chunk taken so far
};

__device__ __forceinline__ TokenValues token_values(const PreAttentionParams& p, std::int64_t token) {
  TokenValues v;
  if (token < p.num_tokens) {
    v.position = __ldg(p.positions + token);
    v.slot = __ldg(p.slots + token);
    v.index_slot = __ldg(p.index_slots + token);
  }
  return v;
}

// Chunk k's tile and first head; heads: how many it has.
struct Chunk {
  std::uint32_t tile;
  std::uint32_t head0;
  std::uint32_t heads;
};
__device__ __forceinline__ Chunk chunk_at(const PreAttentionParams& p, std::uint32_t k) {
  const std::uint32_t tile = p.by_tile_chunks.divide(k);
  const std::uint32_t head0 = (k - tile * p.tile_chunks) * p.chunk_heads;
  return {tile, head0, min(p.chunk_heads, p.heads - head0)};
}

// The producer warp: chunk after chunk of the CTA's run into the stages,
// each as soon as every consumer is done with the stage's last. Lane 0
// starts the row copies and clears the stage's step counter; lanes 0-3 write
// the tile's token values (read a chunk ahead) into the stage meanwhile.
// `full` completes on the four lanes' arrivals, lane 0's and the copies' bytes.
__device__ __forceinline__ void produce(const PreAttentionParams& p, Smem& s, int lane, std::uint32_t begin,
                                        std::uint32_t end) {
  const auto values_of = [&](std::uint32_t k) {
    return token_values(p, std::int64_t(p.by_tile_chunks.divide(k)) * kTileTokens + lane);
  };
  TokenValues next = lane < kTileTokens && begin < end ? values_of(begin) : TokenValues{};
  for (std::uint32_t k = begin, i = 0; k < end; ++k, ++i) {
    const std::uint32_t st = i % kStages;
    if (i >= kStages) sm90::mbar_wait(smem_u32(&s.empty[st]), (i / kStages - 1) & 1);
    const Chunk ch = chunk_at(p, k);
    const std::int64_t first = std::int64_t(ch.tile) * kTileTokens;
    const std::uint32_t bar = smem_u32(&s.full[st]);
    if (lane == 0) {
      const int tokens = static_cast<int>(p.num_tokens - first < kTileTokens ? p.num_tokens - first : kTileTokens);
      const std::uint32_t bytes = ch.heads * kHeadBytes;
      s.taken[st] = 0;
      sm90::mbar_arrive_expect_tx(bar, bytes * tokens);
      for (int t = 0; t < tokens; ++t) {
        const std::uint16_t* src = p.qkv + (first + t) * p.row_stride + std::int64_t(ch.head0) * kHeadDim;
        sm90::bulk_load(smem_u32(&s.stage[st][t * p.chunk_heads * kHeadBytes]), src, bytes, bar);
      }
    }
    if (lane < kTileTokens) {
      s.values[st][lane] = next;
      if (k + 1 < end) next = values_of(k + 1);
      sm90::mbar_arrive(bar);
    }
  }
}

template <int Src, int Dst>
__global__ void __launch_bounds__(kThreads, kMinBlocks) staged_kernel(const PreAttentionParams p) {
  extern __shared__ __align__(128) std::uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const std::uint32_t begin = std::uint32_t(std::uint64_t(p.chunks) * blockIdx.x / gridDim.x);
  const std::uint32_t end = std::uint32_t(std::uint64_t(p.chunks) * (blockIdx.x + 1) / gridDim.x);
  // The producer starts copying without waiting for the gains: it
  // initialises the barriers and only arrives at the start
  // barrier, which the consumers wait at (their gains written, all ready).
  constexpr int kStartBarrier = 1;
  if (warp == kConsumerWarps) {
    if (lane == 0) {
      for (int st = 0; st < kStages; ++st) {
        sm90::mbar_init(smem_u32(&s.full[st]), 1 + kTileTokens);
        sm90::mbar_init(smem_u32(&s.empty[st]), kConsumerWarps * 32);
      }
      sm90::mbar_init_fence();
    }
    __syncwarp();
    sm90::named_barrier_arrive(kStartBarrier, kThreads);
    produce(p, s, lane, begin, end);
    return;
  }
  if (threadIdx.x < kHeadDim) load_gains(p, threadIdx.x, s.gains);
  sm90::named_barrier_sync(kStartBarrier, kThreads);

  const int c = lane & (kLanes - 1);
  const std::uint32_t group = lane / kLanes;  // the tile's token this lane's group takes
  const unsigned mask = ((1u << kLanes) - 1) << (lane & ~(kLanes - 1));
  for (std::uint32_t k = begin, i = 0; k < end; ++k, ++i) {
    const Chunk ch = chunk_at(p, k);
    const std::uint32_t st = i % kStages;
    sm90::mbar_wait(smem_u32(&s.full[st]), (i / kStages) & 1);
    // The chunk's next step not yet taken (>= ch.heads when none is left).
    const auto take = [&] {
      std::uint32_t j = 0;
      if (lane == 0) j = atomicAdd(&s.taken[st], 1u);
      return __shfl_sync(0xFFFFFFFFu, j, 0);
    };
    const TokenValues& v = s.values[st][group];
    Item it;
    it.token = std::int64_t(ch.tile) * kTileTokens + group;
    it.valid = it.token < p.num_tokens;
    it.position = v.position;
    for (std::uint32_t j = take(); j < ch.heads;) {
      const std::uint32_t next = take();  // in flight while this step runs
      it.head = static_cast<std::int32_t>(ch.head0 + j);
      it.kind = pre::head_kind(it.head, p.nq, p.nkv, p.niq);
      it.slot = it.kind == HeadKind::index_k                       ? v.index_slot
                : it.kind == HeadKind::k || it.kind == HeadKind::v ? v.slot
                                                                   : -1;
      std::uint32_t raw[kValues / 2] = {};
      if (it.valid) {
        const uint4* row = reinterpret_cast<const uint4*>(s.stage[st] + (group * p.chunk_heads + j) * kHeadBytes);
        const uint4 a = row[c], b = row[8 + c];
        raw[0] = a.x, raw[1] = a.y, raw[2] = a.z, raw[3] = a.w;
        raw[4] = b.x, raw[5] = b.y, raw[6] = b.z, raw[7] = b.w;
      }
      process_item<Src, Dst, true>(p, s.gains, it, raw, c, mask);
      j = next;
    }
    sm90::mbar_arrive(smem_u32(&s.empty[st]));
  }
}

}  // namespace msa::cuda::pre_detail::staged
