// The epilogue of the wgmma token-tile kernel's consumers (mainloop.cuh):
// each warpgroup's 64 rows normalised, staged by stmatrix in its half of the
// tile's Q buffer, then stored whole by TMA (whole tokens of an unsplit
// tile) or copied out row by row (split items, tiles short of tokens), and
// the rows' lse.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/params.cuh"
#include "cuda/attention/prefill/layout.cuh"
#include "cuda/attention/shared/tile_scheduler.cuh"
#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// What a consumer thread knows of its CTA.
struct Consumer {
  unsigned char* smem;  // the 1024-aligned dynamic shared memory
  WgmmaBars bar;
  int tiles;  // how many tiles the CTA runs (j < tiles)
  int wg, lane;
  int row0;  // the thread's rows of the tile: row0 and row0 + 8
  int col;   // the thread's first column of each 8-column group
  std::uint32_t k_base, v_base;

  __device__ bool has_tile(int j) const { return j < tiles; }
  // The CTA's j-th tile number (read from the launch each time, so that it
  // holds no register through the tile loop).
  __device__ std::int64_t tile_number(int j) const { return blockIdx.x + std::int64_t(j) * gridDim.x; }
  __device__ unsigned char* plan(int b) const { return smem + WgmmaTile::kPlans + b * WgmmaTile::kPlanBytes; }
  __device__ TileEntries entries(int b) const { return list_entries(plan(b) + WgmmaTile::kHeaderBytes); }
  // The warpgroup's half of Q buffer b (its query rows; then its staged output rows).
  __device__ unsigned char* q_rows(int b) const {
    return smem + WgmmaTile::kQ + b * WgmmaTile::kQBuf + wg * WgmmaTile::kQBytes;
  }
  __device__ std::uint32_t q_base(int b) const { return smem_u32(q_rows(b)); }
};

// log2 of the query heads per KV head (a power of two on the wgmma tiles).
__device__ __forceinline__ int group_shift(const AttendParams& p) { return __ffs(p.group) - 1; }

// Where row `row` of a tile goes (-1: nowhere): tokens first .. first + count
// - 1 of the step's output. G divides 64 on the wgmma tiles
// (use_wgmma_tiles): a power of two.
__device__ __forceinline__ std::int64_t tile_row_target(const AttendParams& p, int first, int count, int head,
                                                        int row) {
  const int tok = row >> group_shift(p), g = row & (p.group - 1);
  const std::int64_t qh = std::int64_t(head) * p.group + g;
  if (tok >= count) return -1;
  return std::int64_t(first + tok) * p.num_q_heads + qh;
}

// Where the thread's two rows of a tile go (tile_row_target).
__device__ __forceinline__ void tile_row_targets(const AttendParams& p, const Consumer& c, int first, int count,
                                                 int head, std::int64_t (&at)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) at[i] = tile_row_target(p, first, count, head, c.row0 + 8 * i);
}

// The thread's two rows' sums: the quad's parts of each added up.
//   l: the rows' running sums (the thread's part); sum: the rows' sums
__device__ __forceinline__ void row_sums(const float (&l)[2], float (&sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] = l[i];
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 1);
    sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], 2);
  }
}

// The thread's two rows, normalised by their sums (0 for rows that attended
// nothing), into the warpgroup's staging area, by stmatrix: per pair of
// 8-column groups e, e + 1, the four 8 x 8 matrices (e, rows 0-7 of the warp's
// 16), (e, rows 8-15), (e + 1, rows 0-7), (e + 1, rows 8-15); lane l points at
// row 8 (l / 8 % 2) + l % 8 of its warp's 16, chunk e + l / 16. (The fast
// division's 2-ulp error is far below the 16-bit output's rounding.)
//   o: [64] output fragment; sum: the rows' sums (row_sums);
//   stage: the warpgroup's half of a Q buffer (shared address, 1 KiB aligned)
__device__ __forceinline__ void stage_tile_rows(const AttendParams& p, const Consumer& c, const float (&o)[64],
                                                const float (&sum)[2], std::uint32_t stage) {
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) inv[i] = sum[i] > 0.0f ? __fdividef(p.out_scale, sum[i]) : 0.0f;
  const int row = ((c.row0 - 64 * c.wg) & ~15) + (c.lane & 15);  // (l & 8: rows 8-15 of the warp's)
  // Chunk (e + l / 16) ^ (row % 8) of the row for e = 0: the XOR with e % 8
  // (e even) and the atom's offset below then give chunk e + l / 16.
  const std::uint32_t at = stage + std::uint32_t(row * 128 + (((c.lane >> 4) ^ (row & 7)) << 4));
  auto pair = [&](int e, int i) {
    const float x = o[4 * e + 2 * i] * inv[i], y = o[4 * e + 2 * i + 1] * inv[i];
    return p.out_fp16 ? pack2<true>(x, y) : pack2<false>(x, y);
  };
#pragma unroll
  for (int e = 0; e < 16; e += 2)
    stmatrix_x4((at + std::uint32_t((e >> 3) * WgmmaTile::kQAtomBytes)) ^ std::uint32_t((e & 7) << 4), pair(e, 0),
                pair(e, 1), pair(e + 1, 0), pair(e + 1, 1));
}

// The warpgroup's staged rows (wgmma_q_offset's layout) to their targets
// (tile_row_target; a split item's share: target x splits + split), 16 bytes
// per thread and chunk.
//   out: [rows, 128] 16-bit (the output dtype or the partials')
// Thread t of the warpgroup copies chunk t % 16 of rows t / 16 + 8 k. Rows
// step from one 64-bit base by 32-bit offsets: row tok x G + g goes to
// (first + tok, head x G + g), tok < 64.
__device__ __forceinline__ void copy_out_rows(const AttendParams& p, const Consumer& c, const unsigned char* stage,
                                              int first, int count, int head, int split, int splits, void* out) {
  const int t = ((c.row0 - 64 * c.wg) >> 4) * 32 + c.lane;  // the thread in its warpgroup (warp % 4, lane)
  const int e = t & 15;
  auto* base = static_cast<std::uint16_t*>(out) + 8 * e;
  base += ((std::int64_t(first) * p.num_q_heads + std::int64_t(head) * p.group) * splits + split) * kDim;
  const int shift = group_shift(p);
  // Rows t / 16 + 8 k share their swizzle (row % 8): 8 rows = 1 KiB apart.
  const unsigned char* src = stage + wgmma_q_offset(t >> 4, e);
#pragma unroll
  for (int k = 0; k < 64 * 16 / 128; ++k) {
    const int row = (t >> 4) + 8 * k;  // in the warpgroup's 64
    const int tile_row = 64 * c.wg + row, tok = tile_row >> shift, g = tile_row & (p.group - 1);
    if (tok >= count) continue;
    const std::int64_t at = (tok * p.num_q_heads + g) * splits * kDim;
    const uint4 v = *reinterpret_cast<const uint4*>(src + k * 8 * 128);
    *reinterpret_cast<uint4*>(base + at) = v;
  }
}

// The thread that issues its warpgroup's TMA stores (and waits for them).
__device__ __forceinline__ bool issues_stores(const Consumer& c) { return c.row0 == 64 * c.wg && c.lane == 0; }

// The tile's rows out through the warpgroup's half of Q buffer b (stage):
// free once every warp of the warpgroup is past its last wgmma (the first
// barrier), the wgmma reads (async proxy) ordered before the stores. The rows
// are staged normalised in the layout the query rows came in (wgmma_q_offset:
// two 128-byte-swizzled atoms of 64 dims), which a TMA store through the
// output map (KvMaps::out) reads. The warpgroup's 64 rows go out by TMA when
// they are whole tokens of a tile that is not split (first + 64 wg / G .. of
// the output, all below first + count) and the output has a map; then the
// stores stay in flight (bulk_wait_read before the buffer is handed back,
// bulk_wait at the end). Other rows (split items, tiles short of tokens) are
// copied out by the warpgroup (copy_out_rows).
//   sum: the rows' sums (row_sums)
__device__ __forceinline__ void write_staged_tile(const AttendParams& p, const KvMaps& maps, const Consumer& c,
                                                  const float (&o)[64], const float (&sum)[2], int b, int first,
                                                  int count, int head, int split, int splits, void* out) {
  using W = WgmmaTile;
  unsigned char* stage = c.q_rows(b);
  sm90::fence_proxy_async();
  sm90::named_barrier_sync(W::kStageBar + c.wg, 128);
  stage_tile_rows(p, c, o, sum, smem_u32(stage));
  const int tokens = 64 >> group_shift(p);  // per warpgroup
  const bool by_tma = splits == 1 && maps.has_out != 0 && (c.wg + 1) * tokens <= count;
  if (by_tma) sm90::fence_proxy_async();  // the staged rows before the TMA's reads
  sm90::named_barrier_sync(W::kStageBar + c.wg, 128);
  if (by_tma) {
    if (issues_stores(c)) {
      // The tile's first token and head, read again from its plan header
      // (still the consumers'): kept in registers through the staging, they
      // made ptxas spill in the scaled instances.
      const auto* header = reinterpret_cast<const std::int32_t*>(c.plan(b));
      const int token = header[PlanHeader::kFirst] + c.wg * tokens, qh = header[PlanHeader::kHead] * p.group;
#pragma unroll
      for (int half = 0; half < 2; ++half)
        sm90::tma_store_3d(&maps.out, smem_u32(stage + half * W::kQAtomBytes), 64 * half, qh, token);
      sm90::bulk_commit();
    }
  } else {
    copy_out_rows(p, c, stage, first, count, head, split, splits, out);
  }
}

// The thread's two rows' lse (natural log; -inf for rows that attended
// nothing), by the quads' first lanes. A positive sum is at least 1 (the
// row's max is within kRescaleSlack of m), where the fast log2's error is
// below 2^-22.
//   sum: the rows' sums (row_sums); at: the rows' indices in lse, -1: not written
__device__ __forceinline__ void write_tile_lse(const Consumer& c, const float (&m)[2], const float (&sum)[2],
                                               const std::int64_t (&at)[2], float* lse) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (at[i] >= 0 && lse != nullptr && (c.lane & 3) == 0)
      lse[at[i]] = sum[i] > 0.0f ? (m[i] + __log2f(sum[i])) * kLn2 : -INFINITY;
  }
}

}  // namespace msa::cuda::attention
