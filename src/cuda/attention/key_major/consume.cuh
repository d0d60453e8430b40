// The consumer warpgroups of the key-major kernel (key_major/kernel.cuh):
// warpgroup w runs the items i = w, w + C, ... of the CTA's run, each whole
// (row tok x G + g of an item: query head head x G + g of its token tok). An
// item is one block, so a row's softmax is one pass: S = Q K^T, the masked
// softmax, O = P V, then the rows normalised, staged in the item's Q buffer
// and stored to their partials ([tokens, topk, q_heads, 128]: a token's G
// rows for one slot lie together), by TMA where G >= 8, with their lse. The
// warpgroups do not take turns: with three of them, one's softmax or
// epilogue runs while the others' MMAs do. Within a warpgroup, an item's QK
// is issued as soon as the item before has staged its rows, and runs while
// they are stored.
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

// The partial that item row `row` (tok x G + g) writes, -1 past the item's
// tokens: its row of partial_out and its lse, both [tokens, topk, q_heads] (a
// token's G rows of one slot lie together, so a warp's lse stores fill whole
// sectors).
__device__ __forceinline__ std::int64_t key_major_target(const AttendParams& p, const KeyMajorInfo& info, int row) {
  const int tok = row >> group_shift(p), g = row & (p.group - 1);
  if (tok >= info.count) return -1;
  const std::int64_t token = info.token[tok], qh = std::int64_t(info.head) * p.group + g;
  return (token * p.topk.topk + info.slot[tok]) * p.num_q_heads + qh;
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
    const std::int64_t at = key_major_target(p, info, (t >> 4) + 8 * k);
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

// An item of a consumer warpgroup once its rows and its K tile are in: Q
// buffer b, K / V slot s of load bars h (parity), and whether its page is good.
struct KeyMajorOpen {
  int b, s, h;
  std::uint32_t parity;
  bool runs;
};

// Waits for item i's rows and K tile and issues its QK (S = Q K^T into sc,
// waited for by the item itself); a bad page's too (its scores are not
// used), so that every wait has its one group in flight.
template <bool kF16>
__device__ __forceinline__ KeyMajorOpen open_key_major_item(unsigned char* smem, const KeyMajorBars& bar, int i,
                                                            float (&sc)[64]) {
  using W = KeyMajorTile;
  const KeyMajorInfo* infos = reinterpret_cast<const KeyMajorInfo*>(smem + W::kInfo);
  KeyMajorOpen it;
  it.b = i % W::kQBufs;
  sm90::mbar_wait(bar.q_full(it.b), std::uint32_t((i / W::kQBufs) & 1));
  const int kv = sm90::warp_uniform(infos[it.b].kv);
  it.runs = sm90::warp_uniform(infos[it.b].good) != 0;
  it.s = kv % W::kKvSlots;
  it.h = kv % W::kLoadBars;
  it.parity = std::uint32_t((kv / W::kLoadBars) & 1);
  // Every item waits for its load (a bad page's brings nothing) and releases it.
  sm90::mbar_wait(bar.k_full(it.h), it.parity);
  sm90::fence_registers(sc);
  sm90::wgmma_fence();
  issue_qk<kF16>(sc, smem_u32(smem + W::kQ + it.b * W::kQBuf), smem_u32(smem + W::kK), it.s);
  sm90::wgmma_commit();
  return it;
}

// Warpgroup wg's item i (opened: `it`, its QK in flight into sc) to the end:
// the scores' wait, the softmax, PV, the rows staged; then (kNext) item
// next opened, its QK in flight while this item's rows are stored and their
// lse written; then the item's Q buffer handed back. kNext is a template
// argument, not a branch: ptxas keeps a wgmma in flight only across code
// without joins of paths that differ in it.
template <bool kF16, bool kNext>
__device__ __forceinline__ KeyMajorOpen finish_key_major_item(const AttendParams& p, const KvMaps& maps,
                                                              unsigned char* smem, const KeyMajorBars& bar,
                                                              const Consumer& c, int wg, int t, KeyMajorOpen it,
                                                              int next, float (&sc)[64]) {
  using W = KeyMajorTile;
  const bool by_tma = maps.has_partials != 0;  // the rows out by TMA (store_key_major_rows)
  const KeyMajorInfo& info = reinterpret_cast<const KeyMajorInfo*>(smem + W::kInfo)[it.b];
  unsigned char* stage = smem + W::kQ + it.b * W::kQBuf;
  float m[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  sm90::wgmma_wait<0>();
  sm90::fence_registers(sc);
  if (!it.runs) {
    __syncwarp();
    if (sm90::elect_one()) sm90::mbar_arrive(bar.kv_empty(it.s));
  } else {
    float o[64], l[2] = {0.0f, 0.0f};
    std::uint32_t pa[8][4];
    const int count = sm90::warp_uniform(info.count);
    int limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tok = (c.row0 + 8 * r) >> group_shift(p);
      limit[r] = tok < count ? int(info.keys[tok]) : 0;
    }
    // One block per row: no output yet to rescale (PV writes O fresh).
    softmax_scores_any(sc, m, l, limit[0], limit[1], p.score_scale_log2, c.col);
    softmax_output<kF16>(sc, o, pa, Rescale{});
    // O = P V.
    sm90::mbar_wait(bar.v_full(it.h), it.parity);
    round_pv<kF16, true>(o, pa, smem_u32(smem + W::kV), it.s, [] {});
    // The slot's release: one arrival per consumer warp and item.
    __syncwarp();
    if (sm90::elect_one()) sm90::mbar_arrive(bar.kv_empty(it.s));
    row_sums(l, sum);
    // The warpgroup's wgmma reads of its Q rows are done before they are overwritten.
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(W::kStageBar + wg, 128);
    stage_tile_rows(p, c, o, sum, smem_u32(stage));
    if (by_tma) sm90::fence_proxy_async();  // the staged rows before the TMA's reads
  }
  std::int64_t at[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) at[r] = key_major_target(p, info, c.row0 + 8 * r);
  KeyMajorOpen opened{};
  if constexpr (kNext) opened = open_key_major_item<kF16>(smem, bar, next, sc);
  if (it.runs) {
    sm90::named_barrier_sync(W::kStageBar + wg, 128);
    if (by_tma) {
      if (issues_stores(c)) store_key_major_rows(p, maps, info, smem_u32(stage));
    } else {
      copy_key_major_rows(p, info, t, stage, static_cast<std::uint16_t*>(p.km_partial_out));
    }
  }
  // (-inf where no partial was written: the slot is left out of the merge.)
  write_tile_lse(c, m, sum, at, p.km_partial_lse);
  // The buffer goes back to its loader: every thread's reads of it (the
  // description, the staged rows; the TMA's reads of them) are done, and
  // ordered before the TMA's writes of the next item's rows.
  if (by_tma && it.runs && issues_stores(c)) sm90::bulk_wait_read();
  sm90::fence_proxy_async();
  sm90::mbar_arrive(bar.q_empty(it.b));
  return opened;
}

// Warpgroup wg's items of the CTA's `items` (wg, wg + C, ...), in order,
// software-pipelined: an item's QK is issued once the item before it has
// staged its rows, and runs while those are stored.
template <bool kF16>
__device__ __forceinline__ void consume_key_major_items(const AttendParams& p, const KvMaps& maps,
                                                        unsigned char* smem, const KeyMajorBars& bar, int items,
                                                        int wg, int warp, int lane) {
  using W = KeyMajorTile;
  if (wg >= items) return;
  // The shared epilogue helpers see one warpgroup of 64 rows (wg 0).
  const Consumer c{smem, WgmmaBars{0}, items, 0, lane, 16 * (warp & 3) + (lane >> 2), 2 * (lane & 3), 0, 0};
  const int t = 32 * (warp & 3) + lane;  // the thread in its warpgroup
  float sc[64];
  KeyMajorOpen it = open_key_major_item<kF16>(smem, bar, wg, sc);
  int i = wg;
  for (; i + W::kConsumers < items; i += W::kConsumers)
    it = finish_key_major_item<kF16, true>(p, maps, smem, bar, c, wg, t, it, i + W::kConsumers, sc);
  finish_key_major_item<kF16, false>(p, maps, smem, bar, c, wg, t, it, 0, sc);
  if (maps.has_partials != 0 && issues_stores(c)) sm90::bulk_wait();
}

}  // namespace msa::cuda::attention
