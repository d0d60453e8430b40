// The consumer warpgroups of the key-major kernel (key_major/kernel.cuh):
// warpgroup wg owns rows 64 wg .. 64 wg + 63 of each item (row tok x G + g:
// query head head x G + g of the item's token tok). An item is one block, so
// a row's softmax is one pass: S = Q K^T, the masked softmax, O = P V, then
// the rows normalised, staged in the warpgroup's half of the item's Q buffer
// and stored to their partials ([tokens, topk, q_heads, 128]: a token's G
// rows for one slot lie together), by TMA where G >= 8, with their lse. The warpgroups take turns to issue (QK of one while the other runs its
// softmax, then PV likewise: "ping-pong" on two named barriers).
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

// The warpgroup's staged rows (wgmma_q_offset's layout) to their partials by
// the threads' own stores: thread t of the warpgroup copies chunk t % 16 of
// rows t / 16 + 8 k.
//   out: [partials, 128] 16-bit
__device__ __forceinline__ void copy_key_major_rows(const AttendParams& p, const KeyMajorInfo& info, int wg, int t,
                                                    const unsigned char* stage, std::uint16_t* out) {
  const int e = t & 15;
  // Rows t / 16 + 8 k share their swizzle (row % 8): 8 rows = 1 KiB apart.
  const unsigned char* src = stage + wgmma_q_offset(t >> 4, e);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const std::int64_t at = key_major_target(p, info, 64 * wg + (t >> 4) + 8 * k).out;
    if (at < 0) continue;
    *reinterpret_cast<uint4*>(out + at * kDim + 8 * e) = *reinterpret_cast<const uint4*>(src + k * 8 * 128);
  }
}

// The same by TMA (maps.partials, G >= 8): per token of the warpgroup, its G
// staged rows (whole 1 KiB atoms) as one box per 64-dim half, to the G
// contiguous rows of its (token, slot). One thread issues them, as a bulk group.
__device__ __forceinline__ void store_key_major_rows(const AttendParams& p, const KvMaps& maps,
                                                     const KeyMajorInfo& info, int wg, std::uint32_t stage) {
  const int g = p.group, first = (64 * wg) / g, end = min(info.count, (64 * wg + 64) / g);
  for (int tok = first; tok < end; ++tok) {
    const std::uint32_t rows = stage + std::uint32_t((tok * g - 64 * wg) * 128);
    const int at = info.token[tok] * p.topk.topk + info.slot[tok];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      sm90::tma_store_3d(&maps.partials, rows + half * KeyMajorTile::kQAtomBytes, 64 * half, info.head * g, at);
  }
  sm90::bulk_commit();
}

// The CTA's `items` items, in order.
template <bool kF16>
__device__ __forceinline__ void consume_key_major_items(const AttendParams& p, const KvMaps& maps,
                                                        unsigned char* smem, const KeyMajorBars& bar, int items,
                                                        int wg, int warp, int lane) {
  using W = KeyMajorTile;
  const float scale = p.score_scale_log2;
  const bool by_tma = maps.has_partials != 0;  // the rows out by TMA (store_key_major_rows)
  const Consumer c{smem, WgmmaBars{0}, items, wg, lane, 64 * wg + 16 * (warp & 3) + (lane >> 2), 2 * (lane & 3),
                   0, 0};
  const std::uint32_t k_base = smem_u32(smem + W::kK), v_base = smem_u32(smem + W::kV);
  const int t = 32 * (warp & 3) + lane;  // the thread in its warpgroup
  // The turn to issue starts with warpgroup 0.
  if (wg == 1) sm90::named_barrier_arrive(W::kTurn, W::kTurnPeers);
  for (int i = 0; i < items; ++i) {
    const int b = i % W::kQBufs;
    sm90::mbar_wait(bar.q_full(b), std::uint32_t((i / W::kQBufs) & 1));
    const KeyMajorInfo& info = reinterpret_cast<const KeyMajorInfo*>(smem + W::kInfo)[b];
    const int count = sm90::warp_uniform(info.count), kv = sm90::warp_uniform(info.kv);
    const int block = sm90::warp_uniform(info.block);
    // Whether the warpgroup has rows of the item that run (a good page).
    const bool runs = kv >= 0 && (64 * wg) / p.group < count;
    const int s = kv % W::kKvSlots;
    const std::uint32_t parity = std::uint32_t((kv / W::kKvSlots) & 1);
    const bool last_turn = wg == 1 && i + 1 == items;
    auto take_turn = [&] { sm90::named_barrier_sync(W::kTurn + wg, W::kTurnPeers); };
    auto pass_turn = [&] { sm90::named_barrier_arrive(W::kTurn + (1 - wg), W::kTurnPeers); };
    float o[64], sc[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    std::uint32_t pa[8][4];
    // S = Q K^T.
    if (runs) sm90::mbar_wait(bar.k_full(s), parity);
    take_turn();
    if (runs) {
      round_qk<kF16>(sc, smem_u32(smem + W::kQ + b * W::kQBuf + wg * W::kQBytes), k_base, s, pass_turn);
      int limit[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = (c.row0 + 8 * r) >> group_shift(p);
        limit[r] = tok < count ? info.pos[tok] - block * kBlockKeys + 1 : 0;
      }
      // One block per row: no output yet to rescale (PV writes O fresh).
      softmax_scores_any(sc, m, l, limit[0], limit[1], scale, c.col);
      softmax_output<kF16>(sc, o, pa, Rescale{});
      sm90::mbar_wait(bar.v_full(s), parity);
    } else {
      pass_turn();
    }
    // O = P V.
    take_turn();
    auto pass_pv_turn = [&] {
      if (!last_turn) pass_turn();
    };
    if (runs) round_pv<kF16, true>(o, pa, v_base, s, pass_pv_turn);
    else pass_pv_turn();
    // The block's last item releases its slot (one arrival per consumer warp).
    __syncwarp();
    if (kv >= 0 && info.last != 0 && sm90::elect_one()) sm90::mbar_arrive(bar.kv_empty(s));
    if (runs) {
      unsigned char* stage = smem + W::kQ + b * W::kQBuf + wg * W::kQBytes;
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
        if (issues_stores(c)) store_key_major_rows(p, maps, info, wg, smem_u32(stage));
      } else {
        copy_key_major_rows(p, info, wg, t, stage, static_cast<std::uint16_t*>(p.km_partial_out));
      }
      write_tile_lse(c, m, sum, at, p.km_partial_lse);
    }
    // The buffer goes back to the loaders: every thread's reads of it (the
    // description, the staged rows; the TMA's reads of them) are done, and
    // ordered before the TMA's writes of the next item's rows.
    if (by_tma && runs && issues_stores(c)) sm90::bulk_wait_read();
    sm90::fence_proxy_async();
    sm90::mbar_arrive(bar.q_empty(b));
  }
  if (by_tma && issues_stores(c)) sm90::bulk_wait();
}

}  // namespace msa::cuda::attention
