// Blocks widened ahead (widen.hpp): the mark kernel, the widen kernel and the
// host side that lays out the region, enqueues both and describes the pages
// to the bf16 / fp16 token tiles.
#include "cuda/attention/widen/widen.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cuda/common/fp4_fragments.hpp"
#include "cuda/attention/format.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/attention/shared/step.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/common/device_check.cuh"
#include "msa/cache.hpp"
#include "msa/error.hpp"

namespace msa::cuda::attention {
namespace {

// What both kernels know of the region (WidenArea, device pointers).
struct WidenMarks {
  std::int32_t* table;     // [first_request + requests][block_cap] page, -1 unselected, -2 being claimed, -3 bad
  std::int32_t* counters;  // [2] pages claimed - 1, triples claimed - 1
  std::int32_t* claims;    // [requests][num_kv_heads][block_cap] -1 unclaimed
  std::int32_t* items;     // [pages x num_kv_heads][4] request, block, KV head, cache page
  std::int64_t* gates;     // [2] tile gates of a gated step, else null
  unsigned char* k;        // [pages][num_kv_heads][128][128] MMA type
  unsigned char* v;
  float* scales;           // [pages][num_kv_heads][2][128] per-token K, V scales, or null
  std::int64_t pages;
  int first_request, requests, block_cap;
};

constexpr int kMarkThreads = 256;
constexpr int kWidenThreads = 256;
constexpr int kWidenCtasPerSm = 4;
constexpr int kTileBytes = kBlockKeys * kDim * 2;  // one widened K or V tile of one KV head

// One thread per (KV head, top-k entry, prefill token), tokens fastest, so
// that a warp's lanes are neighbouring tokens, which mostly select the same
// blocks: the eligibility and block-table checks of the token tiles
// (build_union_with), then one lane per distinct (request, head, block) of
// the warp claims it as a work item unless it is claimed already; the first
// claim of a (request, block) checks its block-table entry and claims its page.
__global__ void __launch_bounds__(kMarkThreads) mark_selected_blocks(const AttendParams p, const WidenMarks m) {
  const int tokens = p.num_tokens - p.num_decode_tokens;
  const std::int64_t i = std::int64_t(blockIdx.x) * kMarkThreads + threadIdx.x;
  const bool in_range = i < std::int64_t(tokens) * p.num_kv_heads * p.topk.topk;
  const int token = p.num_decode_tokens + int(in_range ? i % tokens : 0);
  const int entry_of = int(in_range ? i / tokens : 0), head = entry_of / p.topk.topk, k = entry_of % p.topk.topk;
  bool valid = false;
  int r = 0, raw = -1;
  if (in_range) {
    raw = p.topk.row(token, head)[k];
    r = p.token_request[token];
    if (raw >= 0 && r >= m.first_request && r < m.first_request + m.requests && r < p.table.num_rows) {
      const int q0 = p.query_start[r], q1 = p.query_start[r + 1];
      const int pos = token >= q0 && token < q1 ? token_position(token, p.seq_lens[r], q0, q1) : -1;
      const int last = pos / kBlockKeys;
      if (pos < 0) {
      } else if (raw > last || raw >= min(p.table.max_blocks, m.block_cap)) {
        detail::record_bad(p.check, detail::kBadTopkId, token, head, k, raw, r, last + 1);
      } else {
        valid = true;
      }
    }
  }
  // The warp's first lane of each distinct (request, head, block) goes on.
  const std::uint64_t key = valid ? (std::uint64_t(r * p.num_kv_heads + head) << 32) | std::uint32_t(raw)
                                  : ~std::uint64_t(threadIdx.x & 31);
  const unsigned peers = __match_any_sync(0xffffffffu, key);
  if (!valid || (threadIdx.x & 31) != __ffs(peers) - 1) return;
  // (the block-table entry read before the claims, to overlap them)
  const int source = p.table.at(r, raw);
  std::int32_t* claim = m.claims + (std::int64_t(r - m.first_request) * p.num_kv_heads + head) * m.block_cap + raw;
  if (atomicCAS(claim, -1, 0) != -1) return;
  const bool good = source >= 0 && source < p.cache.num_pages;
  // The triple's item and the (request, block)'s page are claimed side by
  // side (neither atomic waits for the other).
  std::int32_t* entry = m.table + std::int64_t(r) * m.block_cap + raw;
  const int was = atomicCAS(entry, -1, -2);
  const std::int64_t at = good ? std::int64_t(atomicAdd(&m.counters[1], 1)) + 1 : -1;
  const bool first = was == -1;
  if (at >= 0 && at < m.pages * p.num_kv_heads)
    *reinterpret_cast<int4*>(m.items + 4 * at) = make_int4(r, raw, head, source);
  if (!first) return;
  if (good) {
    *entry = atomicAdd(&m.counters[0], 1) + 1;
  } else {
    detail::record_bad(p.check, detail::kBadBlockTable, r, raw, 0, source, p.cache.num_pages);
    *entry = -3;
  }
}

// Where a claimed (request, head, block) goes: its K and V tiles in the
// widened planes; null k when it has no page.
struct TilePair {
  unsigned char* k;
  unsigned char* v;
};

// fp8: thread tid takes the 8-code chunks c = tid + 256 j of each plane (row
// c / 16, dims 8 (c % 16) ..), so that a warp's loads and its 16-byte stores
// each cover whole rows.
constexpr int kWidenChunks = kBlockKeys * kDim / 8 / kWidenThreads;  // per plane and thread

// The chunk's 16 bytes of the widened tile (row-major [128][128] MMA type).
__device__ __forceinline__ uint4* widened_chunk(unsigned char* tile, int c) {
  return reinterpret_cast<uint4*>(tile + (c >> 4) * (kDim * 2) + 16 * (c & 15));
}

// The K and V codes of (page, head) of an fp8 cache to the MMA type, exactly
// (widens_exactly), all loads issued before the first conversion.
template <KvKind kKind, bool kF16, class Out>
__device__ __forceinline__ void widen_fp8_tiles(const AttendParams& p, int page, int head, Out out_of) {
  const std::int64_t at = p.cache.offset(page, head, 0, 0);
  uint2 in[2][kWidenChunks];
#pragma unroll
  for (int plane = 0; plane < 2; ++plane) {
#pragma unroll
    for (int j = 0; j < kWidenChunks; ++j) {
      const int c = threadIdx.x + kWidenThreads * j;
      in[plane][j] = __ldg(reinterpret_cast<const uint2*>(static_cast<const unsigned char*>(plane ? p.cache.v : p.cache.k) +
                                                          at + std::int64_t(c >> 4) * p.cache.token_stride + 8 * (c & 15)));
    }
  }
  const TilePair out = out_of();  // (resolved while the loads are in flight)
  if (out.k == nullptr) return;
#pragma unroll
  for (int plane = 0; plane < 2; ++plane) {
#pragma unroll
    for (int j = 0; j < kWidenChunks; ++j) {
      *widened_chunk(plane ? out.v : out.k, threadIdx.x + kWidenThreads * j) =
          fp8x8_to_mma<kKind, kF16>(in[plane][j].x, in[plane][j].y);
    }
  }
}

// The K and V tiles of (page, head) of an nvfp4 cache to the MMA type
// (contract 4.3: each head-slot run holds [128][64] code bytes, then [128][8]
// e4m3 group scales): thread tid takes the scale groups c = tid + 256 j of
// each plane (row c / 8, dims 16 (c % 8) ..), all loads issued first. The
// products e2m1 x e4m3 are exact in bf16 and fp16.
template <bool kF16, class Out>
__device__ __forceinline__ void widen_fp4_tiles(const AttendParams& p, int page, int head, Out out_of) {
  constexpr int kGroups = kBlockKeys * 8 / kWidenThreads;  // per plane and thread
  uint2 codes[2][kGroups];
  std::uint32_t scales[2][kGroups];
#pragma unroll
  for (int plane = 0; plane < 2; ++plane) {
    const unsigned char* slot =
        static_cast<const unsigned char*>(p.cache.k) + nvfp4::slot_offset(p.cache, page, head, plane);
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int c = threadIdx.x + kWidenThreads * j;
      codes[plane][j] = __ldg(reinterpret_cast<const uint2*>(slot + 8 * c));
      scales[plane][j] = __ldg(slot + fp4f::kScaleOffset + c);
    }
  }
  const TilePair out = out_of();  // (resolved while the loads are in flight)
  if (out.k == nullptr) return;
#pragma unroll
  for (int plane = 0; plane < 2; ++plane) {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int c = threadIdx.x + kWidenThreads * j;
      const std::uint32_t scale = fp4f::prmt(e4m3_scales_to_mma<kF16>(scales[plane][j]), 0u, 0x1010u);
      auto* dst = reinterpret_cast<uint4*>((plane ? out.v : out.k) + (c >> 3) * (kDim * 2) + 32 * (c & 7));
      dst[0] = fp4x8_to_mma<kF16>(codes[plane][j].x, scale);
      dst[1] = fp4x8_to_mma<kF16>(codes[plane][j].y, scale);
    }
  }
}

// The per-token K and V scales of a claimed triple (request item.x, block
// item.y, KV head item.z, cache page item.w) into widened page `page`:
// thread t < 128 copies key t's K scale, thread 128 + t its V scale, which is
// 0 for keys past the request's last one (unwritten, any bytes), so that a
// masked key's zero probability stays zero.
__device__ __forceinline__ void copy_token_scales(const AttendParams& p, const WidenMarks& m, const int4& item,
                                                  int page) {
  const int t = threadIdx.x & (kBlockKeys - 1), plane = threadIdx.x / kBlockKeys;
  if (plane > 1) return;
  const float* from = plane ? p.cache.v_scales : p.cache.k_scales;
  float value = from[(std::int64_t(item.w) * kBlockKeys + t) * p.num_kv_heads + item.z];
  if (plane == 1 && std::int64_t(item.y) * kBlockKeys + t >= p.seq_lens[item.x]) value = 0.0f;
  m.scales[((std::int64_t(page) * p.num_kv_heads + item.z) * 2 + plane) * kBlockKeys + t] = value;
}

}  // namespace

// The widen-ahead kernel's work on one claimed triple, per format
// (Format<kKind>::WidenAhead, format.cuh): its K and V tiles (out_of gives
// their place and sets `page`, the widened page), and for fp8 the per-token
// scales.
struct Fp8WidenAhead {
  template <KvKind kKind, bool kF16, class Out>
  __device__ __forceinline__ static void run(const AttendParams& p, const WidenMarks& m, const int4& item, Out out_of,
                                             const int& page) {
    widen_fp8_tiles<kKind, kF16>(p, item.w, item.z, out_of);
    if (m.scales != nullptr && page >= 0 && page < m.pages) copy_token_scales(p, m, item, page);
  }
};
struct Fp4WidenAhead {
  template <KvKind kKind, bool kF16, class Out>
  __device__ __forceinline__ static void run(const AttendParams& p, const WidenMarks&, const int4& item, Out out_of,
                                             const int&) {
    widen_fp4_tiles<kF16>(p, item.w, item.z, out_of);
  }
};

namespace {

// The claimed (request, head, block) triples, K and V each, into their
// pages, by persistent CTAs; a gated step first sets the tile gates (the
// pages fit: the widened tiles run, else the on-the-fly ones), and widens
// nothing when they do not fit. A triple whose block-table entry is bad
// (page -3) is skipped. kWidenCtasPerSm CTAs per SM: the register budget
// (64) that lets ptxas issue all of a thread's loads before its first store.
template <KvKind kKind, bool kF16>
__global__ void __launch_bounds__(kWidenThreads, kWidenCtasPerSm)
    widen_marked_blocks(const AttendParams p, const WidenMarks m) {
  const bool fits = std::int64_t(m.counters[0]) + 1 <= m.pages;
  if (m.gates != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    m.gates[0] = fits ? std::numeric_limits<std::int64_t>::max() : 0;
    m.gates[1] = fits ? 0 : std::numeric_limits<std::int64_t>::max();
  }
  if (!fits) return;
  const std::int64_t triples = std::int64_t(m.counters[1]) + 1;
  auto item_at = [&](std::int64_t at) {  // request, block, head, cache page
    return at < triples ? *reinterpret_cast<const int4*>(m.items + 4 * at) : make_int4(0, 0, 0, -1);
  };
  int4 next = item_at(blockIdx.x);
  for (std::int64_t at = blockIdx.x; at < triples; at += gridDim.x) {
    const int4 item = next;
    next = item_at(at + gridDim.x);  // (the next item's load overlaps this one)
    // The tiles' loads need only the item; their page is looked up meanwhile.
    int page = -1;
    auto out_of = [&] {
      page = m.table[std::int64_t(item.x) * m.block_cap + item.y];
      if (page < 0 || page >= m.pages) return TilePair{nullptr, nullptr};
      const std::int64_t slot = (std::int64_t(page) * p.num_kv_heads + item.z) * kTileBytes;
      return TilePair{m.k + slot, m.v + slot};
    };
    Format<kKind>::WidenAhead::template run<kKind, kF16>(p, m, item, out_of, page);
  }
}

template <KvKind kKind, bool kF16>
void launch_widen(const AttendParams& p, const WidenMarks& m, cudaStream_t s) {
  const std::int64_t ctas = std::min<std::int64_t>(m.pages * p.num_kv_heads,
                                                   std::int64_t(std::max(device_sm_count(), 1)) * kWidenCtasPerSm);
  widen_marked_blocks<kKind, kF16><<<dim3(unsigned(ctas)), dim3(kWidenThreads), 0, s>>>(p, m);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

WidenArea widen_area(const AttentionSchedule& s, unsigned char* base, const StepView& step) {
  WidenArea a;
  a.choice = schedule_widen_choice(s);
  a.num_kv_heads = s.problem.num_kv_heads;
  a.f16 = s.problem.out_dtype == DType::fp16;
  a.map = s.map;
  a.base = base;
  MSA_CHECK(step.num_decodes == a.choice.first_request && step.num_requests - step.num_decodes == a.choice.requests,
            "attend: the plan widens the blocks of ", a.choice.requests, " prefill requests from request ",
            a.choice.first_request, " but the step has ", step.num_requests - step.num_decodes, " from request ",
            step.num_decodes);
  return a;
}

void widen_ahead(const AttendParams& p, const WidenArea& a, DType kv, cudaStream_t s) {
  WidenMarks m{};
  m.table = a.table();
  m.counters = a.counters();
  m.claims = a.claims();
  m.items = a.items();
  m.gates = a.choice.gated ? a.gates() : nullptr;
  m.k = a.k();
  m.v = a.v();
  m.scales = a.token_scales(p);
  m.pages = a.choice.pages;
  m.first_request = a.choice.first_request;
  m.requests = a.choice.requests;
  m.block_cap = a.choice.block_cap;
  MSA_CUDA_CHECK(cudaMemsetAsync(a.base + a.map.widen_fill, 0xff, a.map.widen_fill_bytes, s));
  const std::int64_t marks = std::int64_t(p.num_tokens - p.num_decode_tokens) * p.num_kv_heads * p.topk.topk;
  if (marks > 0) {
    mark_selected_blocks<<<dim3(unsigned((marks + kMarkThreads - 1) / kMarkThreads)), dim3(kMarkThreads), 0, s>>>(
        p, m);
    MSA_CUDA_CHECK_LAUNCH();
  }
  auto launch = [&](auto kind) {
    constexpr KvKind kKind = decltype(kind)::value;
    if (a.f16) launch_widen<kKind, true>(p, m, s);
    else launch_widen<kKind, false>(p, m, s);
  };
  switch (kv) {
    case DType::fp8_e4m3: return launch(std::integral_constant<KvKind, KvKind::e4m3>{});
    case DType::fp8_e5m2: return launch(std::integral_constant<KvKind, KvKind::e5m2>{});
    case DType::nvfp4: return launch(std::integral_constant<KvKind, KvKind::nvfp4>{});
    default: MSA_CHECK(false, "attend: blocks are widened ahead from fp8 or nvfp4 caches, not ", dtype_name(kv));
  }
}

AttendParams widened_params(const AttendParams& p, const WidenArea& a) {
  AttendParams w = p;
  w.cache.dtype = a.f16 ? DType::fp16 : DType::bf16;  // [page][head][128][128]
  w.cache.k = a.k();
  w.cache.v = a.v();
  w.cache.head_stride = kBlockKeys * kDim;
  w.cache.page_stride = std::int64_t(a.num_kv_heads) * w.cache.head_stride;
  w.cache.token_stride = kDim;
  w.cache.num_pages = a.choice.pages;
  w.cache.k_scales = a.token_scales(p);
  w.cache.v_scales = nullptr;
  w.table.data = a.table();
  w.table.row_stride = a.choice.block_cap;
  // Lookups stay inside the region's table whatever the device's step data say.
  w.table.num_rows = std::min(p.table.num_rows, a.choice.first_request + a.choice.requests);
  w.table.max_blocks = std::min(p.table.max_blocks, a.choice.block_cap);
  w.tile_gate = a.choice.gated ? a.gates() : nullptr;
  return w;
}

bool widened_maps(const WidenArea& a, KvMaps& maps) {
  KVCacheView v;  // a bf16 / fp16 cache [page][head][128][128]
  v.dtype = a.f16 ? DType::fp16 : DType::bf16;
  v.k = a.k();
  v.v = a.v();
  v.num_pages = a.choice.pages;
  v.num_kv_heads = a.num_kv_heads;
  v.head_stride = kBlockKeys * kDim;
  v.page_stride = std::int64_t(a.num_kv_heads) * v.head_stride;
  v.token_stride = kDim;
  return make_kv_maps(v, maps);
}

}  // namespace msa::cuda::attention
