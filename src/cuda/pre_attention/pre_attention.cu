// Pre-attention (msa/pre_attention.hpp, contract 10) in one pass over qkv,
// bit-identical to cpu::pre_attention: the launch, its choice between two
// kernels (kernel_choice.hpp), and the warps' kernel. The per-item work is
// item.cuh's; the other kernel, for long steps, is staged_kernel.cuh.
//
// The warps' kernel: items are numbered in tiles of kTileTokens tokens,
// head-major within a tile (in a spreading order of the heads, place_of), so
// the four groups of a warp take one head of four consecutive tokens. A
// persistent grid of independent warps; each takes an equal contiguous run of
// the steps (four items each), or, in the long steps of 16-bit and fp8
// caches, one step in each pass over the grid's warps (use_strided). While it
// processes step k, the qkv row parts of steps k + 1 .. k + kAhead are in
// flight into its staging slots in shared memory (cp.async, no registers
// held), and the small per-token values of step k + 1 in registers; rows that
// do not start on 16 bytes are loaded as they are processed.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>

#include "core/check_pre_attention.hpp"
#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/pre_attention/item.cuh"
#include "cuda/pre_attention/kernel_choice.hpp"
#include "cuda/pre_attention/staged_kernel.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace {

using namespace pre_detail;
using pre_detail::Kernel;

constexpr int kThreads = 128;
constexpr int kAhead = 2;           // steps whose qkv rows are in flight
constexpr int kSlots = kAhead + 1;  // staging slots per warp
// 7 blocks of 4 warps per SM: ptxas keeps every instance within 73 registers
// without spilling (at 8 blocks, 64 registers, it spills).
constexpr int kMinBlocks = 7;

// Item `item`'s token and head: tile item / (heads * kTileTokens), head-major
// within the tile, its j-th head (j * head_step) % heads. head_step (coprime
// to heads, near 0.618 heads) spreads the K / V heads, whose stores cost the
// most, evenly over the tile's order, so that any run of a warp holds its
// share of them.
struct Place {
  std::int64_t token;
  std::int32_t head;
};
__device__ __forceinline__ Place place_of(const PreAttentionParams& p, std::uint32_t item) {
  const std::uint32_t tile = p.by_tile.divide(item);
  const std::uint32_t within = item - tile * p.heads * kTileTokens;
  const std::uint32_t j = within / kTileTokens * p.head_step;
  return {std::int64_t(tile) * kTileTokens + within % kTileTokens,
          static_cast<std::int32_t>(j - p.by_heads.divide(j) * p.heads)};
}

// Elements 8c .. 8c+7 (part 0) and 64+8c .. 64+8c+7 (part 1) of a head.
__device__ __forceinline__ const std::uint16_t* row_part(const PreAttentionParams& p, const Place& at, int c) {
  return p.qkv + at.token * p.row_stride + std::int64_t(at.head) * kHeadDim + 8 * c;
}

__device__ __forceinline__ void load_item(const PreAttentionParams& p, std::uint32_t item, Item& it) {
  const Place at = place_of(p, item);
  it.token = at.token;
  it.head = at.head;
  it.kind = pre::head_kind(it.head, p.nq, p.nkv, p.niq);
  it.valid = item < p.items && it.token < p.num_tokens;
  it.position = 0;
  it.slot = -1;
  if (!it.valid) return;  // a token past the last one: its group runs the norm on zeros
  it.position = __ldg(p.positions + it.token);
  if (it.kind == HeadKind::k || it.kind == HeadKind::v) it.slot = __ldg(p.slots + it.token);
  else if (it.kind == HeadKind::index_k) it.slot = __ldg(p.index_slots + it.token);
}

// A warp's staging slot: the 16 values of each lane for one step, as they are
// in qkv, part g (elements 64g + 8c ..) of lane l at [g][l] (conflict-free reads).
struct RowSlot {
  uint4 part[2][32];
};

// Starts the copy of this lane's two parts of item `item`'s qkv row into
// `slot` (zeros for an item past the last token), as one cp.async group.
__device__ __forceinline__ void fetch_row(const PreAttentionParams& p, std::uint32_t item, int lane, int c,
                                          RowSlot& slot) {
  const Place at = place_of(p, item);
  const bool valid = item < p.items && at.token < p.num_tokens;
  const std::uint16_t* src = valid ? row_part(p, at, c) : p.qkv;
#pragma unroll
  for (int g = 0; g < 2; ++g) cp_async16_zfill(smem_u32(&slot.part[g][lane]), src + 64 * g, valid ? 16 : 0);
  cp_async_commit();
}

// This lane's 16 qkv values of `it` as packed pairs: from the staging slot
// (Vec), or loaded here.   raw: [8]
template <bool Vec>
__device__ __forceinline__ void read_row(const PreAttentionParams& p, const Item& it, int lane, int c,
                                         const RowSlot& slot, std::uint32_t* raw) {
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if constexpr (Vec) v = slot.part[g][lane];
    else if (it.valid) v = load16<false>(row_part(p, Place{it.token, it.head}, c) + 64 * g);
    raw[4 * g] = v.x, raw[4 * g + 1] = v.y, raw[4 * g + 2] = v.z, raw[4 * g + 3] = v.w;
  }
}

// Vec: every qkv row part, q / index q store and cos/sin row is 16-byte
// aligned (checked at launch): the row parts of step k + kAhead are copied
// into the warp's staging slots (cp.async) while it processes step k, and the
// other accesses are single vector ones. Otherwise the rows are loaded when
// processed. Strided: warp w's k-th step is k warps + (w + k) mod warps (pass
// k covers steps [k warps, (k + 1) warps), so that the grid works on
// neighbouring tokens at any time; the rotation moves each warp on by one tile
// position a pass, so that it meets every head kind even where warps is a
// multiple of the heads); else the steps of an equal contiguous run.
template <int Src, int Dst, bool Vec, bool Strided>
__global__ void __launch_bounds__(kThreads, kMinBlocks) warp_kernel(const PreAttentionParams p) {
  __shared__ __align__(16) Gains gains;
  __shared__ RowSlot slots[kThreads / 32][kSlots];
  const int lane = threadIdx.x & 31;
  const int c = lane & (kLanes - 1);
  const unsigned mask = ((1u << kLanes) - 1) << (lane & ~(kLanes - 1));  // this group's lanes
  constexpr std::uint32_t kWarps = kThreads / 32;
  RowSlot* ring = slots[threadIdx.x / 32];
  const std::uint32_t group = lane / kLanes;
  Item cur, next;
  // Step k of the warp: the copy of the row parts of its step k + kAhead
  // (item `ahead`) starts, step k runs (when live), the values of step k + 2
  // (item `after`) come in.
  const auto run = [&](std::uint32_t k, std::uint32_t ahead, std::uint32_t after, bool live) {
    std::uint32_t raw[kValues / 2];
    if constexpr (Vec) {
      // Each lane reads back only the parts it copied itself: its own
      // cp.async groups order the slot's reuse, no warp barrier.
      fetch_row(p, ahead, lane, c, ring[(k + kAhead) % kSlots]);
      cp_async_wait<kAhead>();
    }
    if (live) {
      read_row<Vec>(p, cur, lane, c, ring[k % kSlots], raw);
      process_item<Src, Dst, Vec>(p, gains, cur, raw, c, mask);
    }
    cur = next;
    load_item(p, after, next);
  };
  if constexpr (Strided) {
    const std::uint32_t warps = gridDim.x * kWarps, w = blockIdx.x * kWarps + threadIdx.x / 32;
    const std::uint32_t steps = p.items / kTileTokens, passes = (steps + warps - 1) / warps;
    const auto rotated = [warps](std::uint32_t r, std::uint32_t d) {  // (r + d) mod warps, d < warps
      r += d;
      return r >= warps ? r - warps : r;
    };
    // The item of this group in pass k at rotation r (past the last: past every item).
    const auto item_at = [&](std::uint32_t k, std::uint32_t r) {
      const std::uint32_t s = k * warps + r;
      return k < passes && s < steps ? s * kTileTokens + group : p.items;
    };
    if constexpr (Vec) {
#pragma unroll
      for (int k = 0; k < kAhead; ++k) fetch_row(p, item_at(k, rotated(w, k)), lane, c, ring[k]);
    }
    load_item(p, item_at(0, w), cur);
    load_item(p, item_at(1, rotated(w, 1)), next);
    load_gains(p, threadIdx.x, gains);
    __syncthreads();
    for (std::uint32_t k = 0, r = w; k < passes; ++k, r = rotated(r, 1))  // the last pass leaves some warps out
      run(k, item_at(k + kAhead, rotated(r, kAhead)), item_at(k + 2, rotated(r, 2)), k * warps + r < steps);
  } else {
    const std::uint64_t warps = std::uint64_t(gridDim.x) * kWarps, w = blockIdx.x * kWarps + threadIdx.x / 32;
    const std::uint64_t fours = p.items / kTileTokens;
    const std::uint32_t begin = std::uint32_t(fours * w / warps), end = std::uint32_t(fours * (w + 1) / warps);
    // The item of this group at step s of the warp's run (past the run: past every item).
    const auto item_at = [&](std::uint32_t s) { return s < end ? s * kTileTokens + group : p.items; };
    if constexpr (Vec) {
#pragma unroll
      for (int k = 0; k < kAhead; ++k) fetch_row(p, item_at(begin + k), lane, c, ring[k]);
    }
    load_item(p, item_at(begin), cur);
    load_item(p, item_at(begin + 1), next);
    load_gains(p, threadIdx.x, gains);
    __syncthreads();
    for (std::uint32_t s = begin, k = 0; s < end; ++s, ++k) run(k, item_at(s + kAhead), item_at(s + 2), true);
  }
}

// The step coprime to `heads` nearest 0.618 heads (a golden-ratio stride
// visits any range of heads at near-equal gaps).
std::uint32_t spreading_step(std::uint32_t heads) {
  const auto coprime = [heads](std::uint32_t a) { return std::gcd(a, heads) == 1; };
  const std::uint32_t aim = static_cast<std::uint32_t>(0.618 * heads + 0.5);
  for (std::uint32_t d = 0; d < heads; ++d) {
    if (aim + d < heads && coprime(aim + d)) return aim + d;
    if (aim >= d && aim - d > 0 && coprime(aim - d)) return aim - d;
  }
  return 1;
}

// CTAs of `kernel` (threads, smem bytes of dynamic shared memory) resident
// on one SM, asked once per instance.
template <auto Kernel>
int resident_blocks(int threads, int smem) {
  static const int blocks = [&] {
    int n = 0;
    MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, smem));
    return std::max(n, 1);
  }();
  return blocks;
}

// Whether the warps' kernel takes its steps in strided passes
// (bench/RESULTS.md, pre-attention): where each warp runs at least 16 steps
// (on the H200 16/1 from about 12K tokens, 64/4 from about 3K) the step is
// bound by DRAM, and a grid sweeping neighbouring tokens together keeps its
// reads and writes close. nvfp4 caches, whose K / V steps take longer than
// the others, did not gain, nor did shorter runs, which are latency chains.
constexpr bool use_strided(int dst, std::int64_t steps, std::int64_t warps) {
  return dst != insert_detail::kDstNvfp4 && steps >= 16 * warps;
}

// One wave of resident blocks, fewer when there are fewer items.
template <int Src, int Dst, bool Vec>
void launch_warps(const PreAttentionParams& p, Kernel choice, cudaStream_t stream) {
  constexpr int kItemsPerStep = kThreads / kLanes;
  constexpr auto contiguous = warp_kernel<Src, Dst, Vec, false>;
  const std::int64_t needed = (std::int64_t(p.items) + kItemsPerStep - 1) / kItemsPerStep;
  const std::int64_t wave = std::int64_t(resident_blocks<contiguous>(kThreads, 0)) * device_sm_count();
  const std::int64_t blocks = std::min(needed, wave);
  if constexpr (Vec) {
    const std::int64_t steps = p.items / kTileTokens, warps = blocks * (kThreads / 32);
    if (choice == Kernel::strided || (choice != Kernel::warps && use_strided(Dst, steps, warps))) {
      warp_kernel<Src, Dst, true, true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
      return;
    }
  }
  contiguous<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
}

// The chunks of the staged kernel: a tile's heads in as few runs as a
// stage holds, more (down to a step per consumer warp) where there are too few
// tiles to give every CTA of the wave about four chunks.
void set_chunks(PreAttentionParams& p, std::int64_t tiles, std::int64_t wave) {
  const auto ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  const std::int64_t fewest = ceil_div(p.heads, staged::kMaxChunkHeads);
  const std::int64_t most = std::max(fewest, ceil_div(p.heads, staged::kMinChunkHeads));
  const std::int64_t wanted = std::clamp(ceil_div(4 * wave, tiles), fewest, most);
  p.chunk_heads = static_cast<std::uint32_t>(ceil_div(p.heads, wanted));
  p.tile_chunks = static_cast<std::uint32_t>(ceil_div(p.heads, p.chunk_heads));
  p.by_tile_chunks = FastDivisor(p.tile_chunks);
  p.chunks = static_cast<std::uint32_t>(tiles * p.tile_chunks);  // <= items / kTileTokens
}

// Where the staged kernel is the faster (bench/RESULTS.md, pre-attention):
// rows of at least two full stages' heads, and enough chunks that every CTA's
// pipeline runs long past its fill. The 64/4 shape at 32K tokens gains 2-6%;
// 16/1 (20 heads a row) at 32K tokens is level to 7% slower, and steps of
// 4K tokens or fewer lose 3-11% to the fill.
constexpr std::int64_t kStagedMinHeads = 2 * staged::kMaxChunkHeads;
constexpr std::int64_t kStagedChunksPerCta = 64;

template <int Src, int Dst>
void launch_kernel(PreAttentionParams& p, Kernel kernel, bool vec, std::int64_t tiles, cudaStream_t stream) {
  if (!vec) return launch_warps<Src, Dst, false>(p, kernel, stream);
  if (kernel == Kernel::automatic || kernel == Kernel::staged) {
    constexpr auto staged_kernel = staged::staged_kernel<Src, Dst>;
    constexpr int kSmem = sizeof(staged::Smem);
    static std::atomic<std::uint64_t> raised{0};
    attention::raise_smem_limit_once(raised, staged_kernel, kSmem);
    const std::int64_t wave =
        std::int64_t(resident_blocks<staged_kernel>(staged::kThreads, kSmem)) * device_sm_count();
    set_chunks(p, tiles, wave);
    if (kernel == Kernel::staged || (p.heads >= kStagedMinHeads && p.chunks >= kStagedChunksPerCta * wave)) {
      const std::int64_t blocks = std::min<std::int64_t>(p.chunks, wave);
      staged_kernel<<<static_cast<unsigned>(blocks), staged::kThreads, kSmem, stream>>>(p);
      return;
    }
  }
  launch_warps<Src, Dst, true>(p, kernel, stream);
}

template <int Src>
void launch(PreAttentionParams& p, int dst, Kernel kernel, bool vec, std::int64_t tiles, cudaStream_t stream) {
  insert_detail::with_dst_tag(dst, [&](auto tag) {
    launch_kernel<Src, decltype(tag)::value>(p, kernel, vec, tiles, stream);
  });
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace pre_detail {

void pre_attention_with(Kernel kernel, const KVCacheView& cache, const IndexCacheView& index_cache,
                        const PreAttentionArgs& a, Stream stream, const DeviceCheck& check) {
  check::pre_attention_shape(cache, index_cache, a);
  const int dst = insert_detail::dst_tag(cache.dtype, "pre_attention: cache.dtype");
  const int index_tag = insert_detail::index_dst_tag(index_cache.dtype, "pre_attention: index_cache.dtype");
  if (a.num_tokens == 0) return;
  const std::int64_t tiles = (a.num_tokens + kTileTokens - 1) / kTileTokens;
  const std::int64_t items = tiles * kTileTokens * a.heads_per_token();
  MSA_CHECK(items < (std::int64_t(1) << 31), "pre_attention: num_tokens = ", a.num_tokens, " (rounded up to ",
            tiles * kTileTokens, ") times ", a.heads_per_token(),
            " heads is too large for one launch (at most 2^31 - 1 heads)");

  PreAttentionParams p;
  p.cache = cache;
  p.index_cache = index_cache;
  p.index_tag = index_tag;
  p.qkv = static_cast<const std::uint16_t*>(a.qkv);
  p.row_stride = a.row_stride();
  p.num_tokens = a.num_tokens;
  p.heads = static_cast<std::uint32_t>(a.heads_per_token());
  p.by_tile = FastDivisor(p.heads * kTileTokens);
  p.by_heads = FastDivisor(p.heads);
  p.head_step = spreading_step(p.heads);
  p.items = static_cast<std::uint32_t>(items);
  p.nq = a.num_q_heads;
  p.nkv = a.num_kv_heads;
  p.niq = a.num_index_heads;
  p.positions = a.positions;
  p.q_weight = a.q_weight;
  p.k_weight = a.k_weight;
  p.index_q_weight = a.index_q_weight;
  p.index_k_weight = a.index_k_weight;
  p.weight_tag = table_tag(a.weight_dtype);
  p.eps = a.eps;
  p.cos_sin = a.cos_sin;
  p.cos_sin_tag = table_tag(a.cos_sin_dtype);
  p.max_position = a.max_position;
  p.q = a.q;
  p.q_tag = insert_detail::dst_tag(a.q_dtype, "pre_attention: q_dtype");
  p.q_scale = a.q_scale;
  p.index_q = a.index_q;
  p.index_q_tag = insert_detail::dst_tag(a.index_q_dtype, "pre_attention: index_q_dtype");
  p.slots = a.slots;
  p.index_slots = a.index_slots != nullptr ? a.index_slots : a.slots;
  p.check = check.buffer;
  // Vector accesses and bulk copies: qkv rows, the q / index q rows (16-bit
  // outputs) and the cos/sin rows all start on 16 bytes.
  const auto on16 = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  const bool vec = on16(p.qkv) && p.row_stride % 8 == 0 && on16(p.q) && on16(p.index_q) && on16(p.cos_sin);
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.qkv_dtype == DType::bf16) launch<insert_detail::kSrcBf16>(p, dst, kernel, vec, tiles, s);
  else launch<insert_detail::kSrcFp16>(p, dst, kernel, vec, tiles, s);
}

}  // namespace pre_detail

void pre_attention(const KVCacheView& cache, const IndexCacheView& index_cache, const PreAttentionArgs& args,
                   Stream stream, const DeviceCheck& check) {
  pre_detail::pre_attention_with(pre_detail::Kernel::automatic, cache, index_cache, args, stream, check);
}

}  // namespace msa::cuda
