// The key-major kernel's producer warpgroup (key_major/kernel.cuh). The CTA's
// items are a contiguous run of the item array, where the items of one (KV
// head, request, block) lie together, so a block stays for a run of items.
// Each producer warp reads the run 32 items at a time (one coalesced load, a
// lane per item, the pages looked up in parallel), and finds the items that
// start a block (one whose block differs from the previous item's) by a
// ballot: the CTA's g-th load is the g-th such item, which every warp counts
// alike (a block with a bad page has a load that brings nothing, so that
// every item waits for and releases a load alike).
//  - The streamer (one warp) loads K and V of each started block once, into
//    slot g % 2 on full barriers g % 6, by TMA; the request's last block has
//    its unwritten V rows zeroed before it is published. At the block's last
//    item it arrives on the slot's release with all but 4 n of its count (n:
//    the run's items on the block), so that the slot frees once every
//    consumer warp of those items has arrived.
//  - Loader warp k (three warps) takes the items i = k, k + 3, ... of the run
//    into Q buffer i % 6 (k or k + 3): their tokens, slots and keys, their
//    block's load, and their query rows, by TMA (one box per token, G >= 8:
//    whole 1 KiB swizzle atoms) or copied / converted by the warp otherwise.
//    The three warps' global reads overlap, so an item's round trips do not
//    add up.
#pragma once

#include <cstdint>

#include "cuda/attention/key_major/layout.cuh"
#include "cuda/attention/prefill/load.cuh"
#include "cuda/attention/prefill/scheduler.cuh"
#include "cuda/attention/shared/step.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/common/wgmma.cuh"

namespace msa::cuda::attention {

// The CTA's items: [begin, end) of the first n (balanced over the grid).
struct KeyMajorRun {
  std::int64_t begin, end;
};
__device__ __forceinline__ KeyMajorRun key_major_run(std::int64_t n) {
  return {n * blockIdx.x / gridDim.x, n * (blockIdx.x + 1) / gridDim.x};
}

// The page of item `it`'s block as the block table has it (-1 outside the table).
__device__ __forceinline__ int table_page(const AttendParams& p, const KeyMajorItem& it) {
  return it.request < p.table.num_rows && it.block < p.table.max_blocks ? p.table.at(it.request, it.block) : -1;
}

// Whether two items read the same block.
__device__ __forceinline__ bool same_block(const KeyMajorItem& a, const KeyMajorItem& b) {
  return a.head == b.head && a.request == b.request && a.block == b.block;
}

// Item `it` of lane `src`.
__device__ __forceinline__ KeyMajorItem shfl_item(const KeyMajorItem& it, int src) {
  KeyMajorItem r{};
  r.head = __shfl_sync(0xffffffffu, it.head, src);
  r.request = __shfl_sync(0xffffffffu, it.request, src);
  r.block = __shfl_sync(0xffffffffu, it.block, src);
  r.edge = __shfl_sync(0xffffffffu, it.edge, src);
  r.count = __shfl_sync(0xffffffffu, it.count, src);
  return r;
}

// A batch of 32 items of the run as a warp sees it: lane l holds item j0 + l.
struct ItemBatch {
  KeyMajorItem it;  // (request -1 past the run's end)
  int page;         // its page, -1 when bad (or past the end)
  unsigned loads;   // lanes whose item starts a block (one load each)
  int g;            // this lane's item: the CTA's load of its block
  bool last;        // this lane's item is the last of its block in the run (past the end: false)
};

// Reads items j0 .. j0 + 31 of the run; `before`: the item before j0 (any
// item with request -1 at the run's start), `loads_before`: the loads of the
// run's items before j0 (g of the next load).
__device__ __forceinline__ ItemBatch read_items(const AttendParams& p, KeyMajorRun run, std::int64_t j0,
                                                const KeyMajorItem& before, int loads_before, int lane) {
  ItemBatch b{};
  const std::int64_t j = j0 + lane;
  const bool in = j < run.end;
  if (in) b.it = p.km_items[j];
  else b.it.request = -1;
  KeyMajorItem after{};  // the item after lane 31's
  after.request = -1;
  if (lane == 31 && j + 1 < run.end) after = p.km_items[j + 1];
  const int raw = in ? table_page(p, b.it) : -1;
  b.page = raw >= 0 && raw < p.cache.num_pages ? raw : -1;
  KeyMajorItem prev = shfl_item(b.it, lane > 0 ? lane - 1 : 0), next = shfl_item(b.it, lane < 31 ? lane + 1 : 31);
  if (lane == 0) prev = before;
  if (lane == 31) next = after;
  const bool starts = in && !same_block(b.it, prev);
  b.loads = __ballot_sync(0xffffffffu, starts);
  // The load of the last start at or before this lane.
  const unsigned upto = lane == 31 ? 0xffffffffu : (2u << lane) - 1u;
  b.g = loads_before + __popc(b.loads & upto) - 1;
  b.last = in && (j + 1 == run.end || !same_block(next, b.it));
  return b;
}

// The streamer: K and V of each started block into slot g % 2 once the
// slot's previous block is released (a bad page: the full barriers' arrivals
// alone). Lane 0 issues; the warp zeroes the request's last block's V rows
// past its last written key.
__device__ __forceinline__ void stream_key_major_blocks(const AttendParams& p, const KvMaps& maps,
                                                        unsigned char* smem, const KeyMajorBars& bar, KeyMajorRun run,
                                                        int lane) {
  using W = KeyMajorTile;
  int g = -1, tails = 0;
  std::int64_t first = 0;  // the run index of load g's first item
  KeyMajorItem before{};
  before.request = -1;
  for (std::int64_t j0 = run.begin; j0 < run.end; j0 += 32) {
    const ItemBatch batch = read_items(p, run, j0, before, g + 1, lane);
    const int keys_lane = batch.it.request >= 0 ? p.seq_lens[batch.it.request] - batch.it.block * kBlockKeys : 0;
    before = shfl_item(batch.it, 31);
    // Lanes whose item is the last of its block in the run (a load's last).
    const unsigned ends = __ballot_sync(0xffffffffu, batch.last);
    for (unsigned left = batch.loads | ends; left != 0; left &= left - 1) {
      const int e = __ffs(left) - 1;
      if ((batch.loads >> e) & 1u) {
        const KeyMajorItem it = shfl_item(batch.it, e);
        const int page = __shfl_sync(0xffffffffu, batch.page, e);
        const int keys = __shfl_sync(0xffffffffu, keys_lane, e);  // written keys of the block
        ++g;
        first = j0 + e;
        const int s = g % W::kKvSlots, h = g % W::kLoadBars;
        if (lane == 0 && g >= W::kKvSlots)
          sm90::mbar_wait(bar.kv_empty(s), std::uint32_t(((g / W::kKvSlots) & 1) ^ 1));
        if (page < 0) {
          if (lane == 0) {
            sm90::mbar_arrive(bar.k_full(h));
            sm90::mbar_arrive(bar.v_full(h));
          }
        } else {
          const int c1 = map_coord(maps, 1, it.head, page), c2 = map_coord(maps, 2, it.head, page),
                    c3 = map_coord(maps, 3, it.head, page);
          const std::uint32_t k_dst = smem_u32(smem + W::kK + s * W::kPlaneBytes);
          const std::uint32_t v_dst = smem_u32(smem + W::kV + s * W::kPlaneBytes);
          const bool tail = keys < kBlockKeys;
          if (lane == 0) {
            sm90::mbar_arrive_expect_tx(bar.k_full(h), W::kPlaneBytes);
            sm90::tma_load_4d(k_dst, &maps.k, bar.k_full(h), 0, c1, c2, c3);
            sm90::tma_load_4d(k_dst + W::kAtomBytes, &maps.k, bar.k_full(h), 64, c1, c2, c3);
            const std::uint32_t v_bar = tail ? bar.tail() : bar.v_full(h);
            sm90::mbar_arrive_expect_tx(v_bar, W::kPlaneBytes);
            sm90::tma_load_4d(v_dst, &maps.v, v_bar, 0, c1, c2, c3);
            sm90::tma_load_4d(v_dst + W::kAtomBytes, &maps.v, v_bar, 64, c1, c2, c3);
          }
          __syncwarp();
          if (tail) {
            sm90::mbar_wait(bar.tail(), std::uint32_t(tails & 1));
            ++tails;
            zero_v_rows(smem + W::kV + s * W::kPlaneBytes, keys, lane);
            __syncwarp();
            if (lane == 0) sm90::mbar_arrive(bar.v_full(h));
          }
        }
      }
      if ((ends >> e) & 1u) {
        // n <= kKeyMajorMaxTokens (key_major_mode): the count stays positive.
        const std::int64_t n = j0 + e - first + 1;
        if (lane == 0) sm90::mbar_arrive_count(bar.kv_empty(g % W::kKvSlots), W::kKvRelease - std::uint32_t(4 * n));
      }
    }
  }
}

// Loader warp k: the run's items i = k, k + 3, ... into Q buffer i % 6, each
// once the buffer's previous item is written out. All 32 lanes arrive on the
// buffer's q_full after their own writes; lane 0's arrival also expects the
// rows' bytes when they come by TMA (q_by_tma: the query is the MMA type and
// G >= 8, so that a token's G rows are whole swizzle atoms; a token past the
// item's count loads its last token's rows again, never written out). Other
// queries are staged by the warp (stage_q_rows: cp.async, or converted).
template <bool kF16>
__device__ __forceinline__ void load_key_major_items(const AttendParams& p, const KvMaps& maps, unsigned char* smem,
                                                     const KeyMajorBars& bar, KeyMajorRun run, int k, int lane) {
  using W = KeyMajorTile;
  const bool q_by_tma = maps.has_q_token != 0 && p.q_kind == (kF16 ? kQueryFp16 : kQueryBf16);
  const int tokens_per_item = kKeyMajorRows / p.group;  // <= kItemMaxTokens (G >= 2)
  auto* infos = reinterpret_cast<KeyMajorInfo*>(smem + W::kInfo);
  int loads = 0;  // the run's loads before the batch
  KeyMajorItem before{};
  before.request = -1;
  for (std::int64_t j0 = run.begin; j0 < run.end; j0 += 32) {
    const ItemBatch batch = read_items(p, run, j0, before, loads, lane);
    if (k == 0 && batch.it.request >= 0 && batch.page < 0) {
      detail::record_bad(p.check, detail::kBadBlockTable, batch.it.request, batch.it.block, 0,
                         table_page(p, batch.it), p.cache.num_pages);
    }
    before = shfl_item(batch.it, 31);
    loads += __popc(batch.loads);
    // This warp's items of the batch: run index i = j0 - begin + e with i % 3 == k.
    const int first = int((k - (j0 - run.begin) % W::kLoaderWarps + W::kLoaderWarps) % W::kLoaderWarps);
    for (int e = first; e < 32 && j0 + e < run.end; e += W::kLoaderWarps) {
      const std::int64_t i = j0 - run.begin + e;
      const int b = int(i % W::kQBufs), use = int(i / W::kQBufs);
      KeyMajorInfo* info = infos + b;
      unsigned char* q = smem + W::kQ + b * W::kQBuf;
      const KeyMajorItem it = shfl_item(batch.it, e);
      const bool good = __shfl_sync(0xffffffffu, batch.page, e) >= 0;
      const int g = __shfl_sync(0xffffffffu, batch.g, e);
      const int r = it.request, count = it.count;
      // Lane t: token t (a token past count: the last token's).
      int token = 0, slot = 0, keys = 0;
      if (lane < tokens_per_item) {
        const int edge = it.edge + min(lane, count - 1);
        token = p.km_tokens[edge];
        slot = p.km_slots[edge];
        const int pos = token_position(token, p.seq_lens[r], p.query_start[r], p.query_start[r + 1]);
        keys = min(max(pos - it.block * kBlockKeys + 1, 0), kBlockKeys);
      }
      if (use > 0) sm90::mbar_wait(bar.q_empty(b), std::uint32_t((use - 1) & 1));
      if (lane < count) {
        info->token[lane] = token;
        info->slot[lane] = std::uint8_t(slot);
        info->keys[lane] = std::uint8_t(keys);
      }
      if (lane == 0) {
        info->count = count;
        info->head = it.head;
        info->kv = g;
        info->good = good ? 1 : 0;
      }
      if (q_by_tma) {
        if (lane < tokens_per_item) {
          const std::uint32_t dst = smem_u32(q + lane * p.group * 128);  // the token's G rows: whole atoms of 8
#pragma unroll
          for (int half = 0; half < 2; ++half)
            sm90::tma_load_3d(dst + half * W::kQAtomBytes, &maps.q_token, bar.q_full(b), 64 * half,
                              it.head * p.group, token);
        }
        if (lane == 0) sm90::mbar_arrive_expect_tx(bar.q_full(b), W::kQBuf);
        else sm90::mbar_arrive(bar.q_full(b));
      } else {
        __syncwarp();  // the tokens, for every lane
        stage_q_rows<kF16, 32, kKeyMajorRows>(p, q, count, it.head, [&](int tok) { return info->token[tok]; },
                                              lane);
        sm90::fence_proxy_async();  // the rows are read by wgmma (async proxy)
        sm90::mbar_arrive(bar.q_full(b));
      }
    }
  }
}

}  // namespace msa::cuda::attention
