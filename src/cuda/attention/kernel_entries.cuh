// Tile scheduler and top-k scan of the attention kernel: which (token, KV head,
// split) a CTA owns, and the list of blocks its row reads. Everything here is
// read on the device, so a replayed CUDA graph sees new seq_lens, top-k lists
// and block tables.
#pragma once

#include <cstdint>

#include "cuda/attention/params.cuh"
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
// then [prefill tokens x kv_heads x prefill_splits], split fastest.
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

  const int r = p.token_request[w.token];
  if (r < 0 || r >= p.num_requests) return w;  // inconsistent step data: attend nothing
  w.request = r;
  const int seq = p.seq_lens[r];
  const int q0 = p.query_start[r];
  const int qlen = p.query_start[r + 1] - q0;
  if (seq <= 0) return w;  // padding request
  const int pos = seq - qlen + (w.token - q0);
  w.position = pos >= 0 && pos < seq ? pos : -1;
  return w;
}

// Warp 0 scans the row's top-k entries and writes the usable ones, compacted in
// their original order, to s_pages / s_blocks; returns their count (lane 0's
// value is the one to use). An entry is usable when it is a valid id (>= 0),
// eligible (<= p / 128, inside the block table), not a repeat of an earlier
// entry, and its page is inside the cache. Ineligible ids and bad pages are
// recorded in the DeviceCheck by split 0 (the other splits scan the same row).
//   s_ids: [64] scratch, s_pages / s_blocks: [64] out
__device__ __forceinline__ int scan_topk(const AttendParams& p, const RowWork& w, int lane,
                                         std::int32_t* s_ids, std::int32_t* s_pages,
                                         std::int32_t* s_blocks) {
  if (w.position < 0 || w.request >= p.table_rows) return 0;
  const std::int32_t* row =
      p.topk + std::int64_t(w.token) * p.topk_token_stride + std::int64_t(w.head) * p.topk_head_stride;
  const int last = w.position / kBlockKeys;
  const bool record = w.split == 0;
  for (int k = lane; k < p.topk_count; k += 32) s_ids[k] = row[k];
  __syncwarp();
  int count = 0;
  for (int base = 0; base < p.topk_count; base += 32) {
    const int k = base + lane;
    bool good = false;
    int page = -1;
    int id = -1;
    if (k < p.topk_count) {
      id = s_ids[k];
      if (id >= 0) {
        if (id > last || id >= p.table_cols) {
          if (record)
            detail::record_bad(p.check, detail::kBadTopkId, w.token, w.head, k, id, w.request, last + 1);
        } else {
          bool repeat = false;
          for (int j = 0; j < k; ++j) repeat |= s_ids[j] == id;
          if (!repeat) {
            page = p.table[std::int64_t(w.request) * p.table_stride + id];
            good = page >= 0 && page < p.num_pages;
            if (!good && record)
              detail::record_bad(p.check, detail::kBadBlockTable, w.request, id, 0, page, p.num_pages);
          }
        }
      }
    }
    const unsigned mask = __ballot_sync(0xffffffffu, good);
    if (good) {
      const int at = count + __popc(mask & ((1u << lane) - 1u));
      s_pages[at] = page;
      s_blocks[at] = id;
    }
    count += __popc(mask);
  }
  return count;
}

}  // namespace msa::cuda::attention
