// The consumer warpgroups of the key-major kernel (key_major/kernel.cuh):
// warpgroup w runs the items i = w, w + C, ... of the CTA's run, each whole
// (row tok x G + g of an item: query head head x G + g of its token tok). An
// item is one block, so a row's softmax is one pass: S = Q K^T, the masked
// softmax, O = P V, then the rows normalised, staged in the item's Q buffer
// and stored to their partials ([tokens, topk, q_heads, 128]: a token's G
// rows for one slot lie together), by TMA where G >= 8, with their lse. The
// warpgroups do not take turns: with three of them, one's softmax or
// epilogue runs while the others' MMAs do.
#pragma once

#include <cstdint>

#include "cuda/attention/key_major/layout.cuh"
#include "cuda/attention/prefill/epilogue.cuh"
#include "cuda/attention/prefill/mainloop.cuh"
#include "cuda/attention/prefill/softmax.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// The Q buffer and the K / V slots have the token tiles' layout, so that
// their MMA issue and staging serve here too.
static_assert(KeyMajorTile::kQBytes == WgmmaTile::kQBytes && KeyMajorTile::kQAtomBytes == WgmmaTile::kQAtomBytes &&
                  KeyMajorTile::kPlaneBytes == WgmmaTile::kPlaneBytes &&
                  KeyMajorTile::kAtomBytes == WgmmaTile::kAtomBytes,
              "the key-major buffers follow the token tiles' layout");

// Where item row `row` (tok x G + g) goes, -1 past the item's tokens: its lse
// at [tokens, q_heads, topk] (lse) and its row at [tokens, topk, q_heads] (out).
struct KeyMajorTarget {
  std::int64_t lse, out;
};
__device__ __forceinline__ KeyMajorTarget key_major_target(const AttendParams& p, const KeyMajorInfo& info, int row) {
  const int tok = row >> group_shift(p), g = row & (p.group - 1);
  if (tok >= info.count) return {-1, -1};
  const std::int64_t token = info.token[tok], qh = std::int64_t(info.head) * p.group + g;
  const int slot = info.slot[tok];
  return {(token * p.num_q_heads + qh) * p.topk.topk + slot, (token * p.topk.topk + slot) * p.num_q_heads + qh};
}

// The item's staged rows (wgmma_q_offset's layout) to their partials by the
// warpgroup's own stores: thread t copies chunk t % 16 of rows t / 16 + 8 k.
//   out: [partials, 128] 16-bit
__device__ __forceinline__ void copy_key_major_rows(const AttendParams& p, const KeyMajorInfo& info, int t,
                                                    const unsigned char* stage, std::uint16_t* out) {
  const int e = t & 15;
  // Rows t / 16 + 8 k share their swizzle (row % 8): 8 rows = 1 KiB apart.
  const unsigned char* src = stage + wgmma_q_offset(t >> 4, e);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const std::int64_t at = key_major_target(p, info, (t >> 4) + 8 * k).out;
    if (at < 0) continue;
    *reinterpret_cast<uint4*>(out + at * kDim + 8 * e) = *reinterpret_cast<const uint4*>(src + k * 8 * 128);
  }
}

// The same by TMA (maps.partials, G >= 8): per token of the item, its G
// staged rows (whole 1 KiB atoms) as one box per 64-dim half, to the G
// contiguous rows of its (token, slot). One thread issues them, as a bulk group.
__device__ __forceinline__ void store_key_major_rows(const AttendParams& p, const KvMaps& maps,
                                                     const KeyMajorInfo& info, std::uint32_t stage) {
  const int g = p.group, end = min(info.count, kKeyMajorRows / g);
  for (int tok = 0; tok < end; ++tok) {
    const std::uint32_t rows = stage + std::uint32_t(tok * g * 128);
    const int at = info.token[tok] * p.topk.topk + info.slot[tok];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      sm90::tma_store_3d(&maps.partials, rows + half * KeyMajorTile::kQAtomBytes, 64 * half, info.head * g, at);
  }
  sm90::bulk_commit();
}

// Warpgroup wg's items of the CTA's `items`, in order.
template <bool kF16>
__device__ __forceinline__ void consume_key_major_items(const AttendParams& p, const KvMaps& maps,
                                                        unsigned char* smem, const KeyMajorBars& bar, int items,
                                                        int wg, int warp, int lane) {
  using W = KeyMajorTile;
  const float scale = p.score_scale_log2;
  const bool by_tma = maps.has_partials != 0;  // the rows out by TMA (store_key_major_rows)
  // The shared epilogue helpers see one warpgroup of 64 rows (wg 0).
  const Consumer c{smem, WgmmaBars{0}, items, 0, lane, 16 * (warp & 3) + (lane >> 2), 2 * (lane & 3), 0, 0};
  const std::uint32_t k_base = smem_u32(smem + W::kK), v_base = smem_u32(smem + W::kV);
  const int t = 32 * (warp & 3) + lane;  // the thread in its warpgroup
  auto no_turn = [] {};
  for (int i = wg; i < items; i += W::kConsumers) {
    const int b = i % W::kQBufs;
    sm90::mbar_wait(bar.q_full(b), std::uint32_t((i / W::kQBufs) & 1));
    const KeyMajorInfo& info = reinterpret_cast<const KeyMajorInfo*>(smem + W::kInfo)[b];
    const int count = sm90::warp_uniform(info.count), kv = sm90::warp_uniform(info.kv);
    const bool runs = sm90::warp_uniform(info.good) != 0;  // a good page
    const int s = kv % W::kKvSlots, h = kv % W::kLoadBars;
    const std::uint32_t parity = std::uint32_t((kv / W::kLoadBars) & 1);
    const std::uint32_t q_base = smem_u32(smem + W::kQ + b * W::kQBuf);
    // Every item waits for its load (a bad page's brings nothing) and releases it.
    sm90::mbar_wait(bar.k_full(h), parity);
    if (!runs) {
      __syncwarp();
      if (sm90::elect_one()) sm90::mbar_arrive(bar.kv_empty(s));
      // No partial: lse -inf, which leaves the slot out of the merge.
      std::int64_t at[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) at[r] = key_major_target(p, info, c.row0 + 8 * r).lse;
      const float none[2] = {-INFINITY, -INFINITY}, empty[2] = {0.0f, 0.0f};
      write_tile_lse(c, none, empty, at, p.km_partial_lse);
    } else {
      float o[64], sc[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
      std::uint32_t pa[8][4];
      // S = Q K^T.
      round_qk<kF16>(sc, q_base, k_base, s, no_turn);
      int limit[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = (c.row0 + 8 * r) >> group_shift(p);
        limit[r] = tok < count ? int(info.keys[tok]) : 0;
      }
      // One block per row: no output yet to rescale (PV writes O fresh).
      softmax_scores_any(sc, m, l, limit[0], limit[1], scale, c.col);
      softmax_output<kF16>(sc, o, pa, Rescale{});
      // O = P V.
      sm90::mbar_wait(bar.v_full(h), parity);
      round_pv<kF16, true>(o, pa, v_base, s, no_turn);
      // The slot's release: one arrival per consumer warp and item.
      __syncwarp();
      if (sm90::elect_one()) sm90::mbar_arrive(bar.kv_empty(s));
      unsigned char* stage = smem + W::kQ + b * W::kQBuf;
      float sum[2];
      row_sums(l, sum);
      std::int64_t at[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) at[r] = key_major_target(p, info, c.row0 + 8 * r).lse;
      // The warpgroup's wgmma reads of its Q rows are done before they are overwritten.
      sm90::fence_proxy_async();
      sm90::named_barrier_sync(W::kStageBar + wg, 128);
      stage_tile_rows(p, c, o, sum, smem_u32(stage));
      if (by_tma) sm90::fence_proxy_async();  // the staged rows before the TMA's reads
      sm90::named_barrier_sync(W::kStageBar + wg, 128);
      if (by_tma) {
        if (issues_stores(c)) store_key_major_rows(p, maps, info, smem_u32(stage));
      } else {
        copy_key_major_rows(p, info, t, stage, static_cast<std::uint16_t*>(p.km_partial_out));
      }
      write_tile_lse(c, m, sum, at, p.km_partial_lse);
    }
    // The buffer goes back to its loader: every thread's reads of it (the
    // description, the staged rows; the TMA's reads of them) are done, and
    // ordered before the TMA's writes of the next item's rows.
    if (by_tma && runs && issues_stores(c)) sm90::bulk_wait_read();
    sm90::fence_proxy_async();
    sm90::mbar_arrive(bar.q_empty(b));
  }
  if (by_tma && issues_stores(c)) sm90::bulk_wait();
}

}  // namespace msa::cuda::attention
