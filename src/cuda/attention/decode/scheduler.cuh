// Tile scheduler and top-k scan of the attention kernel: which (token, KV head,
// split) a CTA owns, and the list of blocks its row reads. Everything here is
// read on the device, so a replayed CUDA graph sees new seq_lens, top-k lists
// and block tables.
#pragma once

#include <cstdint>

#include "cuda/attention/params.cuh"
#include "cuda/attention/shared/step.cuh"
#include "cuda/common/device_check.cuh"

namespace msa::cuda::attention {

struct RowWork {
  int token = 0;
  int head = 0;     // KV head
  int split = 0;
  int splits = 1;
  int request = -1;
  int position = -1;  // absolute position p; -1: the row attends nothing
};

// CTAs are numbered decode rows first: [num_decode_tokens x kv_heads x decode_splits],
// then [prefill tokens x kv_heads x prefill_splits], split fastest. Arithmetic
// only: the request and position are resolved by scan_row.
__device__ __forceinline__ RowWork row_of_cta(const AttendParams& p, std::int64_t cta) {
  RowWork w;
  const std::int64_t decode_ctas =
      std::int64_t(p.num_decode_tokens) * p.num_kv_heads * p.decode_splits;
  std::int64_t local = cta;
  int first_token = 0;
  w.splits = p.decode_splits;
  if (cta >= decode_ctas) {
    local = cta - decode_ctas;
    first_token = p.num_decode_tokens;
    w.splits = p.prefill_splits;
  }
  w.split = int(local % w.splits);
  local /= w.splits;
  w.head = int(local % p.num_kv_heads);
  w.token = first_token + int(local / p.num_kv_heads);
  return w;
}

// Warp 0 resolves the row's request and position (into w) and writes its
// usable top-k entries, compacted in their original order, to s_pages /
// s_blocks; returns their count (every lane returns it). An entry is usable
// when it is a valid id (>= 0), eligible (<= p / 128, inside the block table),
// not a repeat of an earlier entry, and its page is inside the cache.
// Ineligible ids and bad pages are recorded in the DeviceCheck by split 0 (the
// other splits scan the same row).
//
// Two dependent round trips before the K/V loads: the token's request and the
// raw ids (independent of each other), then the request's lengths and the
// pages of the ids (loaded speculatively, the table row being known).
//   s_ids: [64] scratch, s_pages / s_blocks: [64] out
__device__ __forceinline__ int scan_row(const AttendParams& p, RowWork& w, int lane,
                                        std::int32_t* s_ids, std::int32_t* s_pages,
                                        std::int32_t* s_blocks) {
  static_assert(kMaxEntries == 64, "two entries per lane");
  const std::int32_t* row =
      p.topk.row(w.token, w.head);
  const int r = p.token_request[w.token];
  int ids[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int k = lane + 32 * c;
    ids[c] = k < p.topk.topk ? row[k] : -1;
  }
  const bool request_ok = r >= 0 && r < p.num_requests;
  const bool table_ok = request_ok && r < p.table.num_rows;
  int seq = 0, q0 = 0, q1 = 0;
  if (request_ok) {
    seq = p.seq_lens[r];
    q0 = p.query_start[r];
    q1 = p.query_start[r + 1];
  }
  int pages[2];
#pragma unroll
  for (int c = 0; c < 2; ++c)
    pages[c] = table_ok && ids[c] >= 0 && ids[c] < p.table.max_blocks
                   ? p.table.at(r, ids[c])
                   : -1;
  w.request = request_ok ? r : -1;
  w.position = request_ok ? token_position(w.token, seq, q0, q1) : -1;
  if (w.position < 0 || !table_ok) return 0;

  const int last = w.position / kBlockKeys;
  const bool record = w.split == 0;
#pragma unroll
  for (int c = 0; c < 2; ++c)
    if (lane + 32 * c < p.topk.topk) s_ids[lane + 32 * c] = ids[c];
  __syncwarp();
  int count = 0;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int k = lane + 32 * c;
    const int id = ids[c];
    bool good = false;
    if (k < p.topk.topk && id >= 0) {
      if (id > last || id >= p.table.max_blocks) {
        if (record)
          detail::record_bad(p.check, detail::kBadTopkId, w.token, w.head, k, id, w.request, last + 1);
      } else {
        bool repeat = false;
        for (int j = 0; j < k; ++j) repeat |= s_ids[j] == id;
        if (!repeat) {
          good = pages[c] >= 0 && pages[c] < p.cache.num_pages;
          if (!good && record)
            detail::record_bad(p.check, detail::kBadBlockTable, w.request, id, 0, pages[c], p.cache.num_pages);
        }
      }
    }
    const unsigned mask = __ballot_sync(0xffffffffu, good);
    if (good) {
      const int at = count + __popc(mask & ((1u << lane) - 1u));
      s_pages[at] = pages[c];
      s_blocks[at] = id;
    }
    count += __popc(mask);
  }
  return count;
}

}  // namespace msa::cuda::attention
