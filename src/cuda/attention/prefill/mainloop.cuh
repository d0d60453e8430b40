// The consumer warpgroups of the wgmma token-tile kernel (prefill/kernel.cuh):
// warpgroup wg owns rows 64 wg .. 64 wg + 63 of each tile. Round i of a tile
// issues S(i) = Q K(i)^T and O += P(i - 1) V(i - 1) on wgmma, then runs the
// online softmax of block i (prefill/softmax.cuh); the turn to issue
// passes between the two warpgroups on named barriers ("ping-pong"). Two
// loops, one per CTA kind:
//  - consume_tiles (bf16 / fp16, persistent CTAs): QK(i) and PV(i - 1) as two
//    wgmma groups, the scores' softmax of block i while the warpgroup's own
//    PV(i - 1) is in flight; tiles follow each other through the plan buffers.
//  - consume_one_tile (fp8, one tile per CTA): one wgmma group per round and a
//    single softmax site, which keeps the instance small (measured 13% faster
//    on 16K-32K-token chunks than the overlapped loop).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/prefill/epilogue.cuh"
#include "cuda/attention/shared/tile_scheduler.cuh"
#include "cuda/attention/prefill/layout.cuh"
#include "cuda/attention/prefill/softmax.cuh"
#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// O += P V(slot) (kFresh: O = P V, O's registers not read): P from
// registers, V an MN-major operand.
//   o: the warpgroup's 64 x 128 output fragment; pa: P as 8 A fragments
template <bool kF16, bool kFresh = false>
__device__ __forceinline__ void issue_pv(float (&o)[64], std::uint32_t (&pa)[8][4], std::uint32_t v_base, int slot) {
  const sm90::Sw128Desc v = sm90::sw128_desc(v_base, WgmmaTile::kAtomBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    sm90::wgmma_rs<kF16>(o, pa[kk], v.at(slot * WgmmaTile::kPlaneBytes + kk * 2048), kFresh && kk == 0 ? 0 : 1);
}

// S = Q K(slot)^T, Q and K from shared memory.
//   sc: the warpgroup's 64 x 128 score fragment
template <bool kF16>
__device__ __forceinline__ void issue_qk(float (&sc)[64], std::uint32_t q_base, std::uint32_t k_base, int slot) {
  const sm90::Sw128Desc q = sm90::sw128_desc(q_base, 16, 1024), k = sm90::sw128_desc(k_base, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    // dims 16 kk .. 16 kk + 15 of the Q rows and of the slot's K rows
    const std::uint32_t q_step = (kk >> 2) * WgmmaTile::kQAtomBytes + (kk & 3) * 32;
    const std::uint32_t k_step = slot * WgmmaTile::kPlaneBytes + (kk >> 2) * WgmmaTile::kAtomBytes + (kk & 3) * 32;
    sm90::wgmma_ss<kF16>(sc, q.at(q_step), k.at(k_step), kk > 0 ? 1 : 0);
  }
}

// A round with PV(slot) alone (the warpgroup attended the previous block,
// not this one; kFresh: issue_pv's): issue, hand the turn on (pass_turn), wait.
template <bool kF16, bool kFresh = false, class PassTurn>
__device__ __forceinline__ void round_pv(float (&o)[64], std::uint32_t (&pa)[8][4], std::uint32_t v_base, int slot,
                                         PassTurn pass_turn) {
  if constexpr (!kFresh) sm90::fence_registers(o);
  sm90::wgmma_fence();
  issue_pv<kF16, kFresh>(o, pa, v_base, slot);
  sm90::wgmma_commit();
  pass_turn();
  sm90::wgmma_wait<0>();
  sm90::fence_registers(o);
  sm90::fence_registers(pa);
}

// A round with QK(slot) alone: issue, hand the turn on, wait for the scores.
template <bool kF16, class PassTurn>
__device__ __forceinline__ void round_qk(float (&sc)[64], std::uint32_t q_base, std::uint32_t k_base, int slot,
                                         PassTurn pass_turn) {
  sm90::fence_registers(sc);
  sm90::wgmma_fence();
  issue_qk<kF16>(sc, q_base, k_base, slot);
  sm90::wgmma_commit();
  pass_turn();
  sm90::wgmma_wait<0>();
  sm90::fence_registers(sc);
}

// A tile's fresh accumulators: O and S zero, running max -inf, sums 0, P zero.
__device__ __forceinline__ void clear_tile_state(float (&o)[64], float (&sc)[64], float (&m)[2], float (&l)[2],
                                                 std::uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int e = 0; e < 64; ++e) o[e] = sc[e] = 0.0f;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0;
}

// The tile's tokens with rows in warpgroup wg (bits lo .. min(hi, count - 1)
// for the 64 rows 64 wg .. 64 wg + 63 of G = group rows per token), as a mask
// (count <= 64, the tile's token masks).
__device__ __forceinline__ std::uint64_t warpgroup_tokens(int wg, int group, int count) {
  const int lo = (64 * wg) / group, hi = min((64 * wg + 63) / group, count - 1);
  if (hi < lo) return 0;
  const std::uint64_t upto = hi >= 63 ? ~std::uint64_t(0) : (std::uint64_t(1) << (hi + 1)) - 1;
  return upto & ~((std::uint64_t(1) << lo) - 1);
}

// Multiplies the thread's score (kPlane 0: by the K scales) or probability
// (kPlane 1: by the V scales) columns by the slot's per-key scales: column
// 8 j + col + e of both rows by scales[kPlane][8 j + col + e].
//   sc: the 64 x 128 fragment; scales: [2 (K, V)][128] in shared memory
template <int kPlane>
__device__ __forceinline__ void scale_columns(float (&sc)[64], const float* scales, int col) {
  const float* factor = scales + kPlane * kBlockKeys;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float2 f = *reinterpret_cast<const float2*>(factor + 8 * j + col);
    sc[4 * j] *= f.x;
    sc[4 * j + 1] *= f.y;
    sc[4 * j + 2] *= f.x;
    sc[4 * j + 3] *= f.y;
  }
}

// Threads of both consumer warpgroups (the turn's named barriers).
inline constexpr int kTurnPeers = WgmmaTile::kConsumers * 128;

// bf16 / fp16: the CTA's tiles, one after the other. Round i of a tile issues
// QK(i) and PV(i - 1) (two groups when the warpgroup attends both blocks);
// the scores' softmax of block i runs while PV(i - 1) is in flight. kScaled
// (fp8 codes widened ahead with per-token scales, which came with K(i) into
// the K slot's scale array): the scores times the K scales before the
// softmax, the probabilities times the V scales after it (the sums stay
// unscaled); every thread releases the slots itself.
template <bool kF16, bool kScaled = false>
__device__ __forceinline__ void consume_tiles(const AttendParams& p, const KvMaps& maps, const Consumer& c) {
  using W = WgmmaTile;
  const float scale = p.score_scale_log2;
  int g0 = 0;
  for (int j = 0; c.has_tile(j); ++j) {
    const bool last_tile = !c.has_tile(j + 1);
    const int b = plan_buffer(j);
    if (j > 0) sm90::named_barrier_sync(W::kPlanFull + b, W::kPlanFullThreads);
    const auto* header = reinterpret_cast<const std::int32_t*>(c.plan(b));
    const TileEntries entries = c.entries(b);
    // The header's fields, the same for the whole warp, broadcast from lane 0
    // so that the compiler keeps them and the loop's control in uniform registers.
    const int n = sm90::warp_uniform(header[PlanHeader::kEntries]);
    const int first = sm90::warp_uniform(header[PlanHeader::kFirst]);
    const int count = sm90::warp_uniform(header[PlanHeader::kCount]);
    const int head = sm90::warp_uniform(header[PlanHeader::kHead]);
    int pos[2];
    std::uint64_t bit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tok = (c.row0 + 8 * i) / p.group;
      pos[i] = tok < count ? entries.pos[tok] : -1;
      bit[i] = pos[i] >= 0 ? std::uint64_t(1) << tok : 0;
    }
    const std::uint64_t wg_tokens = warpgroup_tokens(c.wg, p.group, count);

    const std::uint32_t q_base = c.q_base(b);
    float o[64], sc[64], m[2], l[2];
    std::uint32_t pa[8][4];
    clear_tile_state(o, sc, m, l, pa);

    bool prev_active = false;  // this warpgroup attended block i - 1 (P(i - 1) in pa)
    for (int i = 0; i <= n; ++i) {
      // (a vote: the same for every lane, and a uniform predicate to the compiler)
      const bool active = __any_sync(0xffffffffu, i < n && (entries.mask[i] & wg_tokens) != 0);
      const int s = ring_slot(g0 + i), sp = ring_slot(g0 + i + W::kSlots - 1);
      if (i < n) sm90::mbar_wait(c.bar.full_k(s), ring_parity(g0 + i));
      if (prev_active) sm90::mbar_wait(c.bar.full_v(sp), ring_parity(g0 + i - 1));
      sm90::named_barrier_sync(W::kTurn + c.wg, kTurnPeers);
      // The CTA's very last round does not hand the turn on (warpgroup 1).
      auto pass_turn = [&] {
        if (!(c.wg == 1 && i == n && last_tile)) sm90::named_barrier_arrive(W::kTurn + (1 - c.wg), kTurnPeers);
      };
      auto scores = [&] {
        const int base = entries.block[i] * kBlockKeys;
        const std::uint64_t mask = entries.mask[i];
        const int limit0 = (mask & bit[0]) != 0 ? pos[0] - base + 1 : 0;
        const int limit1 = (mask & bit[1]) != 0 ? pos[1] - base + 1 : 0;
        if constexpr (!kScaled) {
          return softmax_scores_any(sc, m, l, limit0, limit1, scale, c.col);
        } else {
          const float* slot_scales = reinterpret_cast<const float*>(c.smem + W::kScales) + s * 2 * kBlockKeys;
          scale_columns<0>(sc, slot_scales, c.col);
          const Rescale r = softmax_scores_any(sc, m, l, limit0, limit1, scale, c.col);
          scale_columns<1>(sc, slot_scales, c.col);
          return r;
        }
      };
      // Each combination issues straight-line wgmma (no branch inside a group).
      if (prev_active && active) {  // QK(i), then PV(i - 1): two groups, done in order
        sm90::fence_registers(o);
        sm90::fence_registers(sc);
        sm90::wgmma_fence();
        issue_qk<kF16>(sc, q_base, c.k_base, s);
        sm90::wgmma_commit();
        issue_pv<kF16>(o, pa, c.v_base, sp);
        sm90::wgmma_commit();
        pass_turn();
        sm90::wgmma_wait<1>();
        sm90::fence_registers(sc);
        const Rescale r = scores();
        sm90::wgmma_wait<0>();
        sm90::fence_registers(o);
        sm90::fence_registers(pa);
        softmax_output<kF16>(sc, o, pa, r);
      } else if (prev_active) {
        round_pv<kF16>(o, pa, c.v_base, sp, pass_turn);
      } else if (active) {
        round_qk<kF16>(sc, q_base, c.k_base, s, pass_turn);
        const Rescale r = scores();
        softmax_output<kF16>(sc, o, pa, r);
      } else {
        pass_turn();
      }
      __syncwarp();
      // One arrival per warp (kScaled: per thread) and block, whether it attended the block or not.
      if (kScaled || sm90::elect_one()) {
        if (i > 0) sm90::mbar_arrive(c.bar.empty_v(sp));
        if (i < n) sm90::mbar_arrive(c.bar.empty_k(s));
      }
      prev_active = active;
    }
    g0 += n;
    std::int64_t at[2];
    tile_row_targets(p, c, first, count, head, at);
    void* out = p.out;
    float* lse = p.lse;
    int split = 0, splits = 1;
    const TileItem it = tile_item(p, c.tile_number(j));  // as planned
    if (it.splits > 1) {
      // A split item: the rows' partials of its share.
      split = it.split;
      splits = it.splits;
      out = p.tile_partial_out;
      lse = p.tile_partial_lse;
    }
    // The rows first, then the lse: no global store ahead of the staging's
    // proxy fence.
    float sum[2];
    row_sums(l, sum);
    write_staged_tile(p, maps, c, o, sum, b, first, count, head, split, splits, out);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (at[i] >= 0) at[i] = at[i] * splits + split;
    if (splits == 1 && p.tile_splits > 1 && (c.lane & 3) == 0) {
      // A whole tile of a step whose last tiles split: lse slot 0 of its
      // rows' partials tells the merge to leave them (+inf, never an lse).
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (at[i] >= 0) p.tile_partial_lse[at[i] * p.tile_splits] = __int_as_float(0x7f800000);
    }
    write_tile_lse(c, m, sum, at, lse);
    // The plan buffer (its list and Q rows) goes back to the planners for
    // tile j + 2 once the rows are out. Each thread's arrive orders its own
    // reads of the staged rows; the warpgroup's barrier before it is for
    // compute-sanitizer's racecheck, which reported those reads, issued just
    // before the arrive, as racing with the planners' first writes (2,288
    // hazards in ShapeTileSplits; none with the barrier, at the same speed).
    if (c.has_tile(j + 2)) {
      if (issues_stores(c)) sm90::bulk_wait_read();
      sm90::fence_proxy_async();
      sm90::named_barrier_sync(W::kStageBar + c.wg, 128);
      sm90::named_barrier_arrive(W::kPlanFree + b, W::kPlanFreeThreads);
    }
  }
  if (issues_stores(c)) sm90::bulk_wait();
}

// fp8: the CTA's one tile. Round i issues PV(i - 1) and QK(i) as one wgmma
// group; round n (PV(n - 1) alone) ends the tile.
template <bool kF16>
__device__ __forceinline__ void consume_one_tile(const AttendParams& p, const KvMaps& maps, const Consumer& c) {
  using W = WgmmaTile;
  const float scale = p.score_scale_log2;
  const auto* header = reinterpret_cast<const std::int32_t*>(c.plan(0));
  const TileEntries entries = c.entries(0);
  const int n = header[PlanHeader::kEntries], first = header[PlanHeader::kFirst];
  const int count = header[PlanHeader::kCount], head = header[PlanHeader::kHead];
  const int tok0 = c.row0 / p.group, tok1 = (c.row0 + 8) / p.group;  // the thread's rows' tokens
  const int pos0 = tok0 < count ? entries.pos[tok0] : -1, pos1 = tok1 < count ? entries.pos[tok1] : -1;
  const std::uint64_t wg_tokens = warpgroup_tokens(c.wg, p.group, count);
  const std::uint32_t q_base = c.q_base(0);

  float o[64], sc[64], m[2], l[2];
  std::uint32_t pa[8][4];
  clear_tile_state(o, sc, m, l, pa);
  const bool token_scales = p.cache.k_scales != nullptr;

  bool prev_active = false;  // this warpgroup attended block i - 1 (P(i - 1) in pa)
  for (int i = 0;; ++i) {
    const bool last = i >= n;  // round n: PV(n - 1) only
    const bool active = !last && (entries.mask[i] & wg_tokens) != 0;
    const int sq = ring_slot(i), sv = ring_slot(i + W::kSlots - 1);
    if (!last) sm90::mbar_wait(c.bar.full_k(sq), ring_parity(i));
    if (prev_active) sm90::mbar_wait(c.bar.full_v(sv), ring_parity(i - 1));
    sm90::named_barrier_sync(W::kTurn + c.wg, kTurnPeers);
    // The CTA's last round does not hand the turn on (warpgroup 1).
    auto pass_turn = [&] {
      if (!(c.wg == 1 && last)) sm90::named_barrier_arrive(W::kTurn + (1 - c.wg), kTurnPeers);
    };
    // Each combination issues straight-line wgmma (no branch inside a group).
    if (prev_active && active) {
      sm90::fence_registers(o);
      sm90::fence_registers(sc);
      sm90::wgmma_fence();
      issue_pv<kF16>(o, pa, c.v_base, sv);
      issue_qk<kF16>(sc, q_base, c.k_base, sq);
      sm90::wgmma_commit();
      pass_turn();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(o);
      sm90::fence_registers(sc);
      sm90::fence_registers(pa);
    } else if (prev_active) {
      round_pv<kF16>(o, pa, c.v_base, sv, pass_turn);
    } else if (active) {
      round_qk<kF16>(sc, q_base, c.k_base, sq, pass_turn);
    } else {
      pass_turn();
    }
    // Per-token K scales on the score columns, before the K slot (and its
    // scales) goes back to the producer.
    const float* slot_scales = reinterpret_cast<const float*>(c.smem + W::kScales) + sq * 2 * kBlockKeys;
    if (token_scales && active) scale_columns<0>(sc, slot_scales, c.col);
    __syncwarp();
    // One arrival per warp (per thread: every_thread_arrives) and block, whether it attended the block or not.
    if (every_thread_arrives(p) || c.lane == 0) {
      if (i > 0) sm90::mbar_arrive(c.bar.empty_v(sv));
      if (!last) sm90::mbar_arrive(c.bar.empty_k(sq));
    }
    if (last) break;
    if (active) {  // the softmax of block i, at one site
      const int base = entries.block[i] * kBlockKeys;
      const std::uint64_t mask = entries.mask[i];
      const int limit0 = pos0 >= 0 && ((mask >> tok0) & 1) != 0 ? pos0 - base + 1 : 0;
      const int limit1 = pos1 >= 0 && ((mask >> tok1) & 1) != 0 ? pos1 - base + 1 : 0;
      const Rescale r = softmax_scores_any(sc, m, l, limit0, limit1, scale, c.col);
      if (token_scales) {
        // Per-token V scales on the probabilities (the sums stay unscaled):
        // block i's V scales are written with V(i), which the next round
        // waits for anyway; its slot is held until PV(i) is done.
        sm90::mbar_wait(c.bar.full_v(sq), ring_parity(i));
        scale_columns<1>(sc, slot_scales, c.col);
      }
      softmax_output<kF16>(sc, o, pa, r);
    }
    prev_active = active;
  }
  std::int64_t at[2];
  tile_row_targets(p, c, first, count, head, at);
  float sum[2];
  row_sums(l, sum);
  write_staged_tile(p, maps, c, o, sum, 0, first, count, head, 0, 1, p.out);
  write_tile_lse(c, m, sum, at, p.lse);
  if (issues_stores(c)) sm90::bulk_wait();
}

}  // namespace msa::cuda::attention
