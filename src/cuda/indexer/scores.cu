// Block scores of the indexer on tensor cores (contract 5):
//   score[t, h, b] = NaN-lowest max over keys j of block b with j <= p of
//                    dot(index_q[t, h], index_k[j])   (fp32 accumulate)
//
// One warp computes a tile of 16 rows (row = t * H + h) against one block of 128
// keys at a time with mma.sync m16n8k16 (bf16 in, fp32 out): 16 n-tiles of 8
// keys x 8 k-steps. The 128 feature dims are visited in a permuted order that
// is the same for queries and keys (a dot product does not care), chosen so
// that every lane reads its A and B fragments with 16-byte loads straight from
// global memory: lane (g = lane / 4, c = lane % 4) reads dims 32q + 8c .. +8 of
// query rows g, g + 8 and of key g of each n-tile. The query fragments stay in
// registers for the whole tile; key fragments are prefetched two n-tiles ahead.
//
// fp8 e4m3 keys are converted to bf16 on load (exact), nvfp4 keys likewise with
// their group scale (the global scale multiplies the block's max). An fp16 query is split
// into bf16 hi + lo (exact) and costs two MMAs per k-step.
//
// The indexer launches it for the prefill rows the wgmma kernel does not take
// (prefill_scores.cu): consecutive 16-row tiles (a tile may span short
// requests), each warp with its own tile and all 4 walking the same blocks, so
// the key block is read from L2 once and served from L1 to the others. grid.y
// splits the blocks.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/mma.cuh"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

constexpr int kWarps = 4;
constexpr int kTileRows = 16;
constexpr int kNTiles = kBlockSize / 8;  // 16 n-tiles of 8 keys per block
constexpr std::int32_t kBlocksPerSplit = 32;  // blocks per CTA along grid.y; each warp walks all of them

struct ScoreParams {
  const std::uint16_t* q = nullptr;  // [num_tokens, H, 128] bf16/fp16 bits
  const std::uint8_t* keys = nullptr;  // index cache base (bytes)
  std::int64_t page_bytes = 0;         // page stride in bytes
  std::int64_t num_pages = 0;
  BlockTable table;
  StepView step;
  float* scores = nullptr;  // [num_tokens, H, max_blocks]
  std::int32_t max_blocks = 0;
  std::int32_t block_limit = 0;  // columns scored at most per row
  std::int32_t num_heads = 0;
  std::int64_t row_begin = 0;  // rows [row_begin, row_end) in 16-row tiles, kWarps tiles per CTA
  std::int64_t row_end = 0;
  std::int64_t* check = nullptr;  // [8] or null
  float global_scale = 1.0f;      // nvfp4 keys: the cache's dequant scale
};

// What a lane needs to know about one of its two rows.
struct RowInfo {
  std::int64_t row = 0;
  std::int32_t request = -1;  // -1: outside the tile
  std::int32_t pos = -1;      // absolute position, -1 for padding
  std::int32_t last = -1;     // last block scored (-1: none)
};

__device__ __forceinline__ RowInfo row_info(const ScoreParams& p, std::int64_t row, std::int64_t r1) {
  RowInfo ri;
  ri.row = row;
  if (row >= r1) return ri;
  const std::int32_t t = static_cast<std::int32_t>(row / p.num_heads);
  ri.request = p.step.token_request[t];
  ri.pos = p.step.position(t, ri.request);
  if (ri.pos >= 0) ri.last = min(ri.pos / kBlockSize, p.block_limit - 1);
  return ri;
}

__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Query fragments of a lane: rows g and g + 8, dims 32q + 8c .. +8 for q < 4,
// as bf16x2 words (fp16 queries: hi and lo parts).
template <bool kQFp16>
struct QFrag {
  uint4 a[4], b[4];        // rows g, g + 8 (hi part for fp16)
  uint4 a_lo[4], b_lo[4];  // fp16 only
};

template <bool kQFp16>
__device__ __forceinline__ void load_q(const ScoreParams& p, const RowInfo& ra, const RowInfo& rb,
                                       int c, QFrag<kQFp16>& f) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4 va = ra.request >= 0
                         ? __ldg(reinterpret_cast<const uint4*>(p.q + ra.row * kHeadDim + 32 * q + 8 * c))
                         : zero;
    const uint4 vb = rb.request >= 0
                         ? __ldg(reinterpret_cast<const uint4*>(p.q + rb.row * kHeadDim + 32 * q + 8 * c))
                         : zero;
    if constexpr (kQFp16) {
      fp16x2_to_bf16x2_split(va.x, f.a[q].x, f.a_lo[q].x);
      fp16x2_to_bf16x2_split(va.y, f.a[q].y, f.a_lo[q].y);
      fp16x2_to_bf16x2_split(va.z, f.a[q].z, f.a_lo[q].z);
      fp16x2_to_bf16x2_split(va.w, f.a[q].w, f.a_lo[q].w);
      fp16x2_to_bf16x2_split(vb.x, f.b[q].x, f.b_lo[q].x);
      fp16x2_to_bf16x2_split(vb.y, f.b[q].y, f.b_lo[q].y);
      fp16x2_to_bf16x2_split(vb.z, f.b[q].z, f.b_lo[q].z);
      fp16x2_to_bf16x2_split(vb.w, f.b[q].w, f.b_lo[q].w);
    } else {
      f.a[q] = va;
      f.b[q] = vb;
    }
  }
}

// Key formats of the index cache.
constexpr int kKeysBf16 = 0, kKeysE4m3 = 1, kKeysNvfp4 = 2;

// Key fragment of one n-tile: key g of the tile, dims 32q + 8c .. +8.
template <int kKeys>
struct KFrag {
  uint4 w[4];
};
template <>
struct KFrag<kKeysE4m3> {
  uint2 w[4];
};
// nvfp4: the 8 codes of dims 32q + 8c .. + 8 (4 bytes) and the token's 8 group scales.
template <>
struct KFrag<kKeysNvfp4> {
  std::uint32_t w[4];
  uint2 scales;
};

template <int kKeys>
__device__ __forceinline__ void load_k(const std::uint8_t* page, int nt, int g, int c, KFrag<kKeys>& f) {
  const int key = nt * 8 + g;
  if constexpr (kKeys == kKeysNvfp4) {
    const std::uint8_t* row = page + key * index_nvfp4::kRowBytes;
#pragma unroll
    for (int q = 0; q < 4; ++q) f.w[q] = __ldg(reinterpret_cast<const std::uint32_t*>(row + 16 * q + 4 * c));
    f.scales = __ldg(reinterpret_cast<const uint2*>(row + index_nvfp4::kDataBytes));
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (kKeys == kKeysE4m3) {
        f.w[q] = __ldg(reinterpret_cast<const uint2*>(page + key * kHeadDim + 32 * q + 8 * c));
      } else {
        f.w[q] = __ldg(reinterpret_cast<const uint4*>(page + (key * kHeadDim + 32 * q + 8 * c) * 2));
      }
    }
  }
}

// acc += Q(16 rows) . K(n-tile)^T over all 128 dims.
template <bool kQFp16, int kKeys>
__device__ __forceinline__ void mma_ntile(float (&acc)[4], const QFrag<kQFp16>& qf, const KFrag<kKeys>& kf,
                                          int c) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    std::uint32_t k0, k1, k2, k3;  // bf16x2 of dims (0,1) (2,3) (4,5) (6,7) of the 8
    if constexpr (kKeys == kKeysE4m3) {
      k0 = e4m3x2_to_bf16x2(kf.w[q].x & 0xFFFFu);
      k1 = e4m3x2_to_bf16x2(kf.w[q].x >> 16);
      k2 = e4m3x2_to_bf16x2(kf.w[q].y & 0xFFFFu);
      k3 = e4m3x2_to_bf16x2(kf.w[q].y >> 16);
    } else if constexpr (kKeys == kKeysNvfp4) {
      // Group 2q + c / 2 scales dims 32q + 8c .. + 8 (the global scale multiplies the block's max).
      const int grp = 2 * q + (c >> 1);
      const std::uint32_t code = ((grp < 4 ? kf.scales.x : kf.scales.y) >> (8 * (grp & 3))) & 0xFFu;
      const std::uint32_t sf = e4m3_to_bf16x2_splat(code);
      std::uint32_t v[4];
      e2m1x8_to_bf16x2(kf.w[q], v);
      k0 = bf16x2_mul(v[0], sf);
      k1 = bf16x2_mul(v[1], sf);
      k2 = bf16x2_mul(v[2], sf);
      k3 = bf16x2_mul(v[3], sf);
    } else {
      k0 = kf.w[q].x;
      k1 = kf.w[q].y;
      k2 = kf.w[q].z;
      k3 = kf.w[q].w;
    }
    mma_bf16_16816(acc, qf.a[q].x, qf.b[q].x, qf.a[q].y, qf.b[q].y, k0, k1);
    mma_bf16_16816(acc, qf.a[q].z, qf.b[q].z, qf.a[q].w, qf.b[q].w, k2, k3);
    if constexpr (kQFp16) {
      mma_bf16_16816(acc, qf.a_lo[q].x, qf.b_lo[q].x, qf.a_lo[q].y, qf.b_lo[q].y, k0, k1);
      mma_bf16_16816(acc, qf.a_lo[q].z, qf.b_lo[q].z, qf.a_lo[q].w, qf.b_lo[q].w, k2, k3);
    }
  }
}

// NaN-lowest max over the visible keys (j <= pos) of block `blk` for the lane's
// rows g (-> sa) and g + 8 (-> sb), reduced over the 4 lanes of a quad.
template <bool kQFp16, int kKeys>
__device__ __forceinline__ void block_max(const std::uint8_t* page, std::int32_t blk, std::int32_t pos_a,
                                          std::int32_t pos_b, const QFrag<kQFp16>& qf, int g, int c,
                                          float& sa, float& sb) {
  constexpr int kRing = 3;  // fragments in flight: the current n-tile and two ahead
  KFrag<kKeys> kf[kRing];
  load_k<kKeys>(page, 0, g, c, kf[0]);
  load_k<kKeys>(page, 1, g, c, kf[1]);
  float acc[kNTiles][4];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    if (nt + 2 < kNTiles) load_k<kKeys>(page, nt + 2, g, c, kf[(nt + 2) % kRing]);
    acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    mma_ntile<kQFp16, kKeys>(acc[nt], qf, kf[nt % kRing], c);
  }
  float ma = __int_as_float(0x7FFFFFFF), mb = ma;  // NaN: "nothing yet"
  const std::int32_t j0 = blk * kBlockSize + 2 * c;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const std::int32_t j = j0 + nt * 8 + e;
      if (j <= pos_a) ma = fmaxf(ma, acc[nt][e]);
      if (j <= pos_b) mb = fmaxf(mb, acc[nt][2 + e]);
    }
  }
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {
    ma = fmaxf(ma, __shfl_xor_sync(0xffffffffu, ma, m));
    mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, m));
  }
  sa = ma;
  sb = mb;
}

// (kWarps * 32, 1): with the default bounds ptxas spills the fp16-query
// variant on bf16 keys; the register file still holds two CTAs per SM.
template <bool kQFp16, int kKeys>
__global__ void __launch_bounds__(kWarps * 32, 1) block_scores_kernel(const ScoreParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const std::int64_t r0 = p.row_begin + (std::int64_t(blockIdx.x) * kWarps + warp) * kTileRows;
  if (r0 >= p.row_end) return;  // whole warp
  const std::int64_t r1 = min(r0 + kTileRows, p.row_end);
  const std::int32_t split_begin = static_cast<std::int32_t>(blockIdx.y) * kBlocksPerSplit;
  const std::int32_t split_end = min(split_begin + kBlocksPerSplit, p.block_limit);

  const RowInfo ra = row_info(p, r0 + g, r1);
  const RowInfo rb = row_info(p, r0 + g + 8, r1);
  if (split_begin > warp_max(max(ra.last, rb.last))) return;  // no block of this split

  QFrag<kQFp16> qf;
  load_q<kQFp16>(p, ra, rb, c, qf);

  const std::int32_t req_first = p.step.token_request[r0 / p.num_heads];
  const std::int32_t req_last = p.step.token_request[(r1 - 1) / p.num_heads];
  for (std::int32_t r = req_first; r <= req_last; ++r) {
    // The rows of request r among the tile's (tokens are ordered by request).
    const std::int32_t la = ra.request == r ? ra.last : -1;
    const std::int32_t lb = rb.request == r ? rb.last : -1;
    const std::int32_t pa = la >= 0 ? ra.pos : -1;
    const std::int32_t pb = lb >= 0 ? rb.pos : -1;
    const std::int32_t b_end = min(split_end - 1, warp_max(max(la, lb)));
#pragma unroll 1
    for (std::int32_t blk = split_begin; blk <= b_end; ++blk) {
      const std::int32_t page = p.table.at(r, blk);
      float sa, sb;
      if (page < 0 || page >= p.num_pages) {
        if (lane == 0)
          detail::record_bad(p.check, detail::kBadIndexBlockTable, r, blk, 0, page, p.num_pages);
        sa = sb = __int_as_float(0x7FFFFFFF);  // unknown: ranks lowest
      } else {
        block_max<kQFp16, kKeys>(p.keys + page * p.page_bytes, blk, pa, pb, qf, g, c, sa, sb);
        if constexpr (kKeys == kKeysNvfp4) {
          sa *= p.global_scale;
          sb *= p.global_scale;
        }
      }
      if (c == 0 && la >= 0) p.scores[ra.row * p.max_blocks + blk] = blk > la ? -INFINITY : sa;
      if (c == 1 && lb >= 0) p.scores[rb.row * p.max_blocks + blk] = blk > lb ? -INFINITY : sb;
    }
  }
}

}  // namespace

void launch_block_scores(const StepView& step, const IndexerArgs& args, float* scores,
                         std::int32_t max_blocks, std::int32_t block_limit, std::int64_t row_begin,
                         std::int64_t row_end, std::int64_t* check, cudaStream_t stream) {
  const std::int64_t num_tiles = (row_end - row_begin + kTileRows - 1) / kTileRows;
  if (num_tiles <= 0 || block_limit <= 0) return;
  ScoreParams p;
  p.q = static_cast<const std::uint16_t*>(args.index_q);
  p.keys = static_cast<const std::uint8_t*>(args.cache.base);
  const DType kd = args.cache.dtype;
  p.page_bytes = kd == DType::nvfp4 ? args.cache.page_stride : args.cache.page_stride * std::int64_t(dtype_bytes(kd));
  p.global_scale = args.cache.global_scale;
  p.num_pages = args.cache.num_pages;
  p.table = args.block_table;
  p.step = step;
  p.scores = scores;
  p.max_blocks = max_blocks;
  p.block_limit = block_limit;
  p.num_heads = args.num_kv_heads;
  p.row_begin = row_begin;
  p.row_end = row_end;
  p.check = check;
  const dim3 grid(static_cast<unsigned>((num_tiles + kWarps - 1) / kWarps),
                  static_cast<unsigned>((block_limit + kBlocksPerSplit - 1) / kBlocksPerSplit));
  const bool q16 = args.iq_dtype == DType::fp16;
  const int threads = kWarps * 32;
  auto run = [&](auto q_fp16, auto keys) {
    block_scores_kernel<decltype(q_fp16)::value, decltype(keys)::value><<<grid, threads, 0, stream>>>(p);
  };
  using F = std::false_type;
  using T = std::true_type;
  using B = std::integral_constant<int, kKeysBf16>;
  using E = std::integral_constant<int, kKeysE4m3>;
  using N = std::integral_constant<int, kKeysNvfp4>;
  if (kd == DType::nvfp4) q16 ? run(T{}, N{}) : run(F{}, N{});
  else if (kd == DType::fp8_e4m3) q16 ? run(T{}, E{}) : run(F{}, E{});
  else q16 ? run(T{}, B{}) : run(F{}, B{});
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::indexer
