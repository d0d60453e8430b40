// Block scores of the prefill rows (contract 5) as a GEMM on Hopper tensor
// cores: index queries (M) x index keys (N) over the 128 features (K), with the
// causal "max" over each block of 128 keys in the epilogue.
//
// Work: a tile is 256 consecutive rows (t * H + h) of one prefill request;
// tile i sees blocks 0 .. the block of its last position. The (tile, block)
// pairs of the step, in order, are one list that the persistent grid (one CTA
// per SM) cuts into equal contiguous ranges, so a CTA stays on one or two tiles
// and every SM gets the same number of blocks whatever the causal shape.
//
// A CTA is a producer warpgroup (one thread issues the TMA loads: the tile's
// queries once per tile, then the key blocks through the block table into a
// ring of stages) and consumer warpgroups: two of 128 rows each (bf16, nvfp4),
// or four of 64 (e4m3, whose MMAs are too short to hide a block max). At a tile's
// start a consumer takes its rows' query fragments from shared memory into
// registers (ldmatrix) and hands the buffer back, so that the next tile's
// queries load while it works and its MMAs read only the keys from shared
// memory. Per block it issues wgmma m64n128 (k16 bf16 / fp16, or k32 fp8
// e4m3) for each of its m64 halves, A from registers and the keys from the
// stage (in the TMA's 128-byte swizzle), waits, frees the stage, and reduces
// each row of its fp32 accumulators to the block's max in registers
// (masking keys beyond the row's position only in blocks that need it); each
// row's score is written once. The top-k follows in select.cu.
//
// nvfp4 pages (72-byte rows, no tensor map) are bulk-copied into a ring of
// raw stages; the whole producer warpgroup widens each into a key stage of the
// query's type (nvfp4_widen.cuh), which the consumers read as they read bf16
// keys, and a consumer thread loads the queries. The global scale multiplies
// the block max.
//
// nvfp4 keys widened ahead (widen_keys.hpp) are loaded like bf16 keys, block b
// of request r from its widened slot once the table's page is found in range.
#include <atomic>
#include <cmath>
#include <cstdint>

#include <cuda.h>

#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/indexer/nvfp4_widen.cuh"
#include "cuda/indexer/prefill_scores.hpp"
#include "cuda/indexer/widen_keys.hpp"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

using ::msa::cuda::ldmatrix_x4;
using ::msa::cuda::smem_u32;
namespace sm90 = ::msa::cuda::sm90;

constexpr int kTile = kPrefillTileRows;
constexpr int kStages = 4;
constexpr int kRawStages = 3;      // nvfp4 pages in flight
constexpr int kWidenWarps = 4;     // the producer warpgroup
constexpr int kRawBytes = int(index_nvfp4::kPageBytes);

template <PrefillKeys K>
constexpr bool is_nvfp4() {
  return K == PrefillKeys::nvfp4_bf16 || K == PrefillKeys::nvfp4_fp16;
}
template <PrefillKeys K>
constexpr bool is_widened() {
  return K == PrefillKeys::widened_bf16 || K == PrefillKeys::widened_fp16;
}
// fp16 MMAs (fp16 queries on nvfp4 keys).
template <PrefillKeys K>
constexpr bool is_fp16() {
  return K == PrefillKeys::nvfp4_fp16 || K == PrefillKeys::widened_fp16;
}
// Consumer warpgroups, each with kHalves m64 halves of the 256-row tile. An
// e4m3 block's MMAs take half the tensor time of a 16-bit one while its block
// max costs the same instructions: four warpgroups of one half each keep the
// tensor pipe fed while others reduce (two of two halves left it idler).
template <PrefillKeys K>
constexpr int kConsumerGroups = K == PrefillKeys::e4m3 ? 4 : 2;
template <PrefillKeys K>
constexpr int kHalves = 4 / kConsumerGroups<K>;
template <PrefillKeys K>
constexpr int kConsumerWarps = 4 * kConsumerGroups<K>;
template <PrefillKeys K>
constexpr int kThreads = 128 * (1 + kConsumerGroups<K>);  // the producer warpgroup first
// Registers per thread of the two roles (the SM's 65,536 shared out between
// the producer warpgroup and the consumers): nvfp4's widening warps take more
// for independent groups in flight; e4m3's four consumers hold one half each.
template <PrefillKeys K>
constexpr int kProducerRegs = is_nvfp4<K>() ? 56 : K == PrefillKeys::e4m3 ? 32 : 40;
template <PrefillKeys K>
constexpr int kConsumerRegs = is_nvfp4<K>() ? 224 : K == PrefillKeys::e4m3 ? 112 : 232;
// setmaxnreg only moves registers between the CTA's warps: the two roles' must
// fit what the launch gives each thread (65,536 / kThreads, in steps of 8).
template <PrefillKeys K>
constexpr bool registers_fit() {
  return 128 * kProducerRegs<K> + 128 * kConsumerGroups<K> * kConsumerRegs<K> <=
         kThreads<K> * (65536 / kThreads<K> / 8 * 8);
}
// Elements of the MMA: 8-bit for e4m3, 16-bit otherwise (nvfp4 widened).
template <PrefillKeys K>
constexpr int elem_bytes() {
  return K == PrefillKeys::e4m3 ? 1 : 2;
}
// A block of keys / a tile of queries in shared memory.
template <PrefillKeys K>
constexpr int key_bytes() {
  return kBlockSize * kHeadDim * elem_bytes<K>();
}
template <PrefillKeys K>
constexpr int query_bytes() {
  return kTile * kHeadDim * elem_bytes<K>();
}
template <PrefillKeys K>
constexpr int smem_bytes() {
  return query_bytes<K>() + kStages * key_bytes<K>() + (is_nvfp4<K>() ? kRawStages * kRawBytes + 256 : 0) +
         1024;  // + alignment slack
}

// d (64 x 128 fp32) (+)= A (64 x 32 e4m3 from registers: each warp's 16 rows,
// lane (g, c) rows g and g + 8, bytes 4c .. 4c + 3 and 16 + 4c ..) x B (128 x 32
// e4m3, K-major at descriptor b).
__device__ __forceinline__ void wgmma_e4m3(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t b,
                                           int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
      "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

struct Params {
  StepView step;
  BlockTable table;
  std::int64_t num_pages = 0;
  float* scores = nullptr;  // [num_tokens, H, max_blocks]
  std::int32_t max_blocks = 0;
  std::int32_t block_limit = 0;
  std::int32_t num_heads = 0;
  std::int64_t* check = nullptr;  // [8] DeviceCheck buffer or null
};

// nvfp4 pages: a kernel argument of its own, so that the Params of the other
// kinds (and their code) stay as they are.
struct Nvfp4Pages {
  const std::uint8_t* base = nullptr;  // the index cache, pages bulk-copied from here
  std::int64_t page_bytes = 0;         // page stride in bytes
  float global_scale = 1.0f;           // multiplies the block max (nvfp4 and widened keys)
};

// Tile i of prefill request r.
struct TileRef {
  std::int32_t request = 0, index = 0;
};

__device__ __forceinline__ std::int32_t request_rows(const Params& p, std::int32_t r) {
  return (p.step.query_start[r + 1] - p.step.query_start[r]) * p.num_heads;
}
__device__ __forceinline__ std::int32_t request_tiles(const Params& p, std::int32_t r) {
  return (request_rows(p, r) + kTile - 1) / kTile;
}
// Blocks tile i of request r scores: those up to its last row's position.
__device__ __forceinline__ std::int32_t tile_blocks(const Params& p, std::int32_t r, std::int32_t i) {
  const std::int32_t seq = p.step.seq_lens[r];
  if (seq <= 0) return 0;
  const std::int32_t qlen = p.step.query_start[r + 1] - p.step.query_start[r];
  const std::int32_t last_row = min((i + 1) * kTile, qlen * p.num_heads) - 1;
  const std::int32_t pos = seq - qlen + last_row / p.num_heads;
  return min(pos / kBlockSize + 1, p.block_limit);
}

struct Range {
  TileRef tile;
  std::int32_t block = 0, count = 0;
};

// Warp-wide: the CTA's equal share of the step's (tile, block) list.
__device__ Range cta_range(const Params& p, int lane) {
  const std::int32_t r0 = p.step.num_decodes, r1 = p.step.num_requests;
  std::int64_t total = 0;
  for (std::int32_t r = r0; r < r1; ++r) {
    const std::int32_t tiles = request_tiles(p, r);
    for (std::int32_t i0 = 0; i0 < tiles; i0 += 32) {
      std::int32_t n = i0 + lane < tiles ? tile_blocks(p, r, i0 + lane) : 0;
#pragma unroll
      for (int m = 16; m >= 1; m >>= 1) n += __shfl_xor_sync(0xffffffffu, n, m);
      total += n;
    }
  }
  const std::int64_t per = (total + gridDim.x - 1) / gridDim.x;
  const std::int64_t first = min(total, per * std::int64_t(blockIdx.x));
  Range out;
  out.count = std::int32_t(min(total, first + per) - first);
  std::int64_t before = 0;
  for (std::int32_t r = r0; r < r1 && out.count > 0; ++r) {
    const std::int32_t tiles = request_tiles(p, r);
    for (std::int32_t i0 = 0; i0 < tiles; i0 += 32) {
      const std::int32_t n = i0 + lane < tiles ? tile_blocks(p, r, i0 + lane) : 0;
      std::int32_t incl = n;
#pragma unroll
      for (int m = 1; m < 32; m <<= 1) {
        const std::int32_t v = __shfl_up_sync(0xffffffffu, incl, m);
        if (lane >= m) incl += v;
      }
      const bool here = n > 0 && before + incl - n <= first && first < before + incl;
      const std::uint32_t hit = __ballot_sync(0xffffffffu, here);
      if (hit != 0) {
        const int src = __ffs(hit) - 1;
        out.tile = TileRef{r, i0 + src};
        out.block = std::int32_t(first - before - __shfl_sync(0xffffffffu, incl - n, src));
        return out;
      }
      before += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
  return out;
}

// What the producer tells the consumers of a stage.
struct StageInfo {
  std::int32_t block;
  std::int32_t page_ok;
  std::int32_t new_tile;  // first block of a tile in this CTA: wait for its queries
  std::int32_t row0;      // the tile's first row (t * H + h)
  std::int32_t rows;      // its rows (<= 256)
  std::int32_t row_in_req;  // row0's index among its request's rows
  std::int32_t pos_req;   // position of the request's first token
  std::int32_t pos0;      // position of row0's token: the tile's lowest
};

// A stage's info, read by every lane of a consumer warp: every lane arrives
// on the stage's empty barrier itself (consume's release), so that each
// lane's reads are ordered before the producer's next write to the slot.
__device__ __forceinline__ StageInfo stage_info(const StageInfo* at) { return *at; }

// Walks the CTA's (tile, block) range in order.
struct Cursor {
  TileRef t;
  std::int32_t b = 0;   // block of tile t
  std::int32_t nb = 0;  // blocks tile t scores
  bool new_tile = true;

  __device__ Cursor(const Params& p, const Range& range)
      : t(range.tile), b(range.block), nb(range.count > 0 ? tile_blocks(p, t.request, t.index) : 0) {}

  // What the consumers need to know of the current (tile, block), but page_ok.
  __device__ StageInfo info(const Params& p) const {
    const std::int32_t r = t.request;
    const std::int32_t qlen = p.step.query_start[r + 1] - p.step.query_start[r];
    StageInfo si;
    si.block = b;
    si.page_ok = 0;
    si.new_tile = new_tile ? 1 : 0;
    si.row_in_req = t.index * kTile;
    si.row0 = p.step.query_start[r] * p.num_heads + si.row_in_req;
    si.rows = min(kTile, qlen * p.num_heads - si.row_in_req);
    si.pos_req = p.step.seq_lens[r] - qlen;
    si.pos0 = si.pos_req + si.row_in_req / p.num_heads;
    return si;
  }

  __device__ void advance(const Params& p) {
    new_tile = false;
    if (++b == nb) {
      b = 0;
      new_tile = true;
      do {
        if (++t.index == request_tiles(p, t.request)) {
          t.index = 0;
          ++t.request;
        }
      } while (t.request < p.step.num_requests && (nb = tile_blocks(p, t.request, t.index)) == 0);
    }
  }
};

// The tensor load of a tile's queries (rows row0 .. row0 + 255) into `queries`.
template <PrefillKeys K>
__device__ __forceinline__ void load_queries(const CUtensorMap* query_map, std::uint8_t* queries, std::uint64_t* q_full,
                                             std::int32_t row0) {
  const std::uint32_t bar = smem_u32(q_full);
  sm90::mbar_arrive_expect_tx(bar, query_bytes<K>());
  const std::uint32_t dst = smem_u32(queries);
  // Boxes of 128 bytes per row: two for 16-bit queries.
  for (int box = 0; box < elem_bytes<K>(); ++box) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            dst + box * (query_bytes<K>() / 2)),
        "l"(reinterpret_cast<std::uint64_t>(query_map)), "r"(64 * box), "r"(row0), "r"(bar)
        : "memory");
  }
}

// The cursor's block into a stage: its info, page_ok set, to `slot`; then
// `bytes` expected on the barrier and load(page, barrier) issued, or for a
// page outside the cache the entry recorded and the barrier arrived on.
template <class Load>
__device__ __forceinline__ void load_block(const Params& p, const Cursor& cur, StageInfo si, StageInfo* slot,
                                           std::uint64_t* barrier, std::uint32_t bytes, const Load& load) {
  const std::int32_t page = p.table.at(cur.t.request, cur.b);
  const bool ok = page >= 0 && page < p.num_pages;
  si.page_ok = ok ? 1 : 0;
  *slot = si;
  const std::uint32_t bar = smem_u32(barrier);
  if (!ok) {
    detail::record_bad(p.check, detail::kBadIndexBlockTable, cur.t.request, cur.b, 0, page, p.num_pages);
    sm90::mbar_arrive(bar);
  } else {
    sm90::mbar_arrive_expect_tx(bar, bytes);
    load(page, bar);
  }
}

// bf16 / e4m3: one thread loads the CTA's range, the queries once per tile and
// each block's boxes by tensor loads into the key ring.
template <PrefillKeys K>
__device__ void produce(const Params& p, const CUtensorMap* key_map, const CUtensorMap* query_map, Range range,
                        std::uint8_t* queries, std::uint8_t* ring, std::uint64_t* full, std::uint64_t* empty,
                        std::uint64_t* q_full, std::uint64_t* q_empty, StageInfo* info) {
  Cursor cur(p, range);
  std::int32_t tiles_loaded = 0;
  for (std::int32_t k = 0; k < range.count; ++k) {
    StageInfo si = cur.info(p);
    if (cur.new_tile) {
      // The queries buffer is free once every consumer warp holds the last tile's in registers.
      sm90::mbar_wait(smem_u32(q_empty), (tiles_loaded & 1) ^ 1);
      load_queries<K>(query_map, queries, q_full, si.row0);
      ++tiles_loaded;
    }
    const int s = k % kStages;
    sm90::mbar_wait(smem_u32(&empty[s]), ((k / kStages) & 1) ^ 1);
    load_block(p, cur, si, &info[s], &full[s], key_bytes<K>(), [&](std::int32_t page, std::uint32_t bar) {
      const std::uint32_t dst = smem_u32(ring + s * key_bytes<K>());
      std::int32_t at = page;
      if constexpr (is_widened<K>()) at = std::int32_t(widened_slot(p.step, p.block_limit, cur.t.request, cur.b));
      sm90::tma_load_3d(dst, key_map, bar, 0, 0, at);
      if constexpr (elem_bytes<K>() == 2) sm90::tma_load_3d(dst + key_bytes<K>() / 2, key_map, bar, 64, 0, at);
    });
    cur.advance(p);
  }
}

// nvfp4: the producer warpgroup (thread 0 .. 127) widens raw stage
// k % kRawStages into key stage k % kStages and passes its info on; thread 0
// also bulk-copies the pages, kRawStages - 1 blocks ahead, waiting only for a
// raw stage to be free (the consumers load the queries), so that it widens
// with the others.
template <PrefillKeys K>
__device__ void widen(const Params& p, const Nvfp4Pages& fp4, const Range& range, std::uint8_t* raw_ring,
                      std::uint8_t* ring, std::uint64_t* full, std::uint64_t* empty, std::uint64_t* raw_full,
                      std::uint64_t* raw_empty, StageInfo* raw_info, StageInfo* info, int thread) {
  Cursor cur(p, range);
  std::int32_t issued = 0;
  // The load of block `issued` into its raw stage.
  auto issue = [&]() {
    const int r = issued % kRawStages;
    sm90::mbar_wait(smem_u32(&raw_empty[r]), ((issued / kRawStages) & 1) ^ 1);
    load_block(p, cur, cur.info(p), &raw_info[r], &raw_full[r], kRawBytes, [&](std::int32_t page, std::uint32_t bar) {
      sm90::bulk_load(smem_u32(raw_ring + r * kRawBytes), fp4.base + page * fp4.page_bytes, kRawBytes, bar);
    });
    cur.advance(p);
    ++issued;
  };
  if (thread == 0) {
    while (issued < min(range.count, kRawStages - 1)) issue();
  }
  for (std::int32_t k = 0; k < range.count; ++k) {
    // Block k + kRawStages - 1 into the stage block k - 1 held (free once
    // every warp has widened it).
    if (thread == 0 && issued < range.count) issue();
    const int s = k % kStages, r = k % kRawStages;
    sm90::mbar_wait(smem_u32(&empty[s]), ((k / kStages) & 1) ^ 1);
    sm90::mbar_wait(smem_u32(&raw_full[r]), (k / kRawStages) & 1);
    const StageInfo si = raw_info[r];
    if (si.page_ok) {
      widen_nvfp4_page<K == PrefillKeys::nvfp4_fp16, kWidenWarps * 32>(raw_ring + r * kRawBytes,
                                                                         ring + s * key_bytes<K>(), thread);
    }
    // Each thread frees the raw stage after its own reads of it.
    sm90::mbar_arrive(smem_u32(&raw_empty[r]));
    if (thread == 0) info[s] = si;
    // The stores are read by wgmma (the async proxy).
    sm90::fence_proxy_async();
    __syncwarp();
    if ((thread & 31) == 0) sm90::mbar_arrive(smem_u32(&full[s]));
  }
}

// NaN-lowest max of this thread's 32 columns of each of its two rows of an
// m64 half (a tree), keys past the row's position NaN when Masked.
//   d: [64] the half's accumulators (layout below), pos: [2] row positions (-1: none),
//   mx: [2] out, per row
template <bool Masked>
__device__ __forceinline__ void block_max(const float (&d)[64], const std::int32_t (&pos)[2], std::int32_t first_key,
                                          int c, float (&mx)[2]) {
  const float kNaN = __int_as_float(0x7FFFFFFF);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float v0 = d[4 * j + 2 * half], v1 = d[4 * j + 2 * half + 1];
      if constexpr (Masked) {
        const std::int32_t lim = pos[half] - first_key;
        if (8 * j + 2 * c > lim) v0 = kNaN;
        if (8 * j + 2 * c + 1 > lim) v1 = kNaN;
      }
      v[j] = fmaxf(v0, v1);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = fmaxf(v[j], v[j + 8]);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = fmaxf(v[j], v[j + 4]);
    mx[half] = fmaxf(fmaxf(v[0], v[2]), fmaxf(v[1], v[3]));
  }
}

// The accumulator of a consumer's m64 half: thread (warp w of the warpgroup,
// lane g * 4 + c) holds rows 16w + g and 16w + g + 8, columns 8j + 2c, + 1 for
// j < 16, at d[4j + (0, 1)] and d[4j + (2, 3)].
//
// bf16 and e4m3 pipeline the two halves over pairs of blocks: while half 0 of
// block k is reduced, half 1 of block k multiplies; while half 1 is reduced,
// half 0 of block k + 1 multiplies, and so on to the pair's end. A half's
// query fragments and row positions change at a new tile only once its own
// MMAs of the old tile are done.
template <PrefillKeys K>
__device__ void consume(const Params& p, float global_scale, const CUtensorMap* query_map, const Range& range,
                        std::uint8_t* queries, const std::uint8_t* ring, std::uint64_t* full, std::uint64_t* empty,
                        std::uint64_t* q_full, std::uint64_t* q_empty, const StageInfo* info, int wg, int tid) {
  const float kNaN = __int_as_float(0x7FFFFFFF);
  constexpr int kSteps = elem_bytes<K>() == 2 ? 8 : 4;  // k16 / k32 steps over the 128 features
  constexpr int kBox = elem_bytes<K>() == 2 ? 64 : 128;   // features per 128-byte row of a box
  constexpr int kPerBox = kSteps * kBox / kHeadDim;        // k-steps per box
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
  std::int32_t tiles_seen = 0;
  constexpr int H = kHalves<K>;
  float d[H][64];
  // The tile's query fragments, the A operand from registers: [m64 half][k-step][4].
  std::uint32_t a[H][kSteps][4];
  // Positions of this thread's two rows of each half in its tile (-1: no row).
  std::int32_t pos[H][2];
#pragma unroll
  for (int m = 0; m < H; ++m) pos[m][0] = pos[m][1] = -1;
  // The scores row this thread writes for each half (lanes c = 0, 1: row g + 8c
  // of its warp's 16), its blocks' columns; null where it writes none.
  float* out[H];
#pragma unroll
  for (int m = 0; m < H; ++m) out[m] = nullptr;

  // Block k's stage, once its keys landed.
  auto wait_stage = [&](std::int32_t k) {
    sm90::mbar_wait(smem_u32(&full[k % kStages]), (k / kStages) & 1);
    return stage_info(&info[k % kStages]);
  };
  // A new tile's queries in shared memory (nvfp4: one consumer thread loads
  // them once every consumer warp holds the last tile's).
  auto wait_queries = [&](const StageInfo& si) {
    if constexpr (is_nvfp4<K>()) {
      if (wg == 0 && tid == 0) {
        sm90::mbar_wait(smem_u32(q_empty), (tiles_seen & 1) ^ 1);
        load_queries<K>(query_map, queries, q_full, si.row0);
      }
    }
    sm90::mbar_wait(smem_u32(q_full), tiles_seen & 1);
    ++tiles_seen;
  };
  // Half m's query fragments and row positions of the tile of si. ldmatrix
  // (the warp converged first): lane l addresses row (l & 7) + 8 ((l >> 3) & 1)
  // of its warp's 16 rows of the half and 16-byte chunk (l >> 4) of the k-step's two.
  auto take_half = [&](int m, const StageInfo& si) {
    __syncwarp();
    const int row = wg * (64 * H) + m * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      const int box = st / kPerBox, chunk = 2 * (st % kPerBox) + (lane >> 4);
      ldmatrix_x4(a[m][st], smem_u32(queries + box * (query_bytes<K>() / (kHeadDim / kBox)) + row * 128 +
                                     ((chunk ^ (row & 7)) << 4)));
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int32_t local = wg * (64 * H) + m * 64 + warp * 16 + g + 8 * half;
      pos[m][half] = local < si.rows ? si.pos_req + (si.row_in_req + local) / p.num_heads : -1;
    }
    const std::int32_t mine = c == 0 ? pos[m][0] : pos[m][1];
    out[m] = c < 2 && mine >= 0
                 ? p.scores + (std::int64_t(si.row0) + wg * (64 * H) + m * 64 + warp * 16 + g + 8 * c) * p.max_blocks
                 : nullptr;
  };
  // The queries are in registers: the buffer may take the next tile's.
  auto hand_back_queries = [&]() {
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(smem_u32(q_empty));
  };
  // Half m of block k: its MMAs as one commit group. A stage whose page was
  // out of range holds stale keys: multiplied anyway (no branch around the
  // group), its scores discarded.
  const sm90::Sw128Desc ring_desc = sm90::sw128_desc(smem_u32(ring), 16, 1024);
  auto issue = [&](int m, std::int32_t k) {
    const std::uint32_t stage = std::uint32_t(k % kStages) * key_bytes<K>();
    sm90::wgmma_fence();
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      // Features of k-step st: box (st * 16 or 32) / kBox, byte 32 * (st % steps per box) of its rows.
      const int box = st / kPerBox, col = 32 * (st % kPerBox);
      const std::uint64_t bd = ring_desc.at(stage + box * (key_bytes<K>() / (kHeadDim / kBox)) + col);
      if constexpr (K == PrefillKeys::e4m3) wgmma_e4m3(d[m], a[m][st], bd, st > 0);
      else sm90::wgmma_rs<is_fp16<K>(), true>(d[m], a[m][st], bd, st > 0);
    }
    sm90::wgmma_commit();
  };
  // Half m's block max of block si.block, written once per row.
  auto reduce = [&](int m, const StageInfo& si) {
    const std::int32_t first_key = si.block * kBlockSize;
    // Only a tile's last blocks hold keys beyond some of its rows: the masked
    // reduction is a separate branch, so that the others skip its selects.
    float mx[2];
    if (!si.page_ok) {
      mx[0] = mx[1] = kNaN;
    } else if (first_key + kBlockSize - 1 > si.pos0) {
      block_max<true>(d[m], pos[m], first_key, c, mx);
    } else {
      block_max<false>(d[m], pos[m], first_key, c, mx);
    }
    float v[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      v[half] = mx[half];
      v[half] = fmaxf(v[half], __shfl_xor_sync(0xffffffffu, v[half], 1));
      v[half] = fmaxf(v[half], __shfl_xor_sync(0xffffffffu, v[half], 2));
      if constexpr (is_nvfp4<K>() || is_widened<K>()) v[half] *= global_scale;
    }
    if (out[m] != nullptr) {
      const bool second = c == 1;
      out[m][si.block] = first_key > (second ? pos[m][1] : pos[m][0]) ? -INFINITY : (second ? v[1] : v[0]);
    }
  };

  // Block k's stage is free once every consumer thread is past both its
  // halves: an arrival per thread, no barrier.
  auto release = [&](std::int32_t k) { sm90::mbar_arrive(smem_u32(&empty[k % kStages])); };
  // A block's stage and, at a new tile, the tile's queries into registers.
  auto start_block = [&](std::int32_t k) {
    const StageInfo si = wait_stage(k);
    if (si.new_tile) {
      wait_queries(si);
#pragma unroll
      for (int m = 0; m < H; ++m) take_half(m, si);
      hand_back_queries();
    }
    return si;
  };
  if constexpr (H == 1 || is_nvfp4<K>()) {
    // A block at a time, every half's group waited for before its max. One
    // half per warpgroup: the other warpgroups' MMAs run while this one
    // reduces. nvfp4 waits on its widening: a block's stage goes back as soon
    // as its MMAs are done, before any wait for the next (the pairs below
    // would hold it until the next block is widened).
    for (std::int32_t k = 0; k < range.count; ++k) {
      const StageInfo cur = start_block(k);
#pragma unroll
      for (int m = 0; m < H; ++m) issue(m, k);
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int m = 0; m < H; ++m) sm90::fence_registers(d[m]);
      release(k);
#pragma unroll
      for (int m = 0; m < H; ++m) reduce(m, cur);
    }
  } else {
    // Blocks in pairs, every group waited for within the pair (ptxas serializes
    // wgmma whose groups stay in flight around a loop).
    for (std::int32_t k = 0; k < range.count; k += 2) {
      const StageInfo cur = start_block(k);
      issue(0, k);
      issue(1, k);
      sm90::wgmma_wait<1>();
      sm90::fence_registers(d[0]);
      reduce(0, cur);
      if (k + 1 < range.count) {
        // Half 0 of block k + 1 multiplies while half 1 of block k is reduced,
        // and half 1 of block k + 1 while half 0 of it is.
        const StageInfo next = wait_stage(k + 1);
        if (next.new_tile) {
          wait_queries(next);
          take_half(0, next);
        }
        issue(0, k + 1);
        sm90::wgmma_wait<1>();
        sm90::fence_registers(d[1]);
        release(k);
        reduce(1, cur);
        if (next.new_tile) {
          take_half(1, next);
          hand_back_queries();
        }
        issue(1, k + 1);
        sm90::wgmma_wait<1>();
        sm90::fence_registers(d[0]);
        reduce(0, next);
        sm90::wgmma_wait<0>();
        sm90::fence_registers(d[1]);
        release(k + 1);
        reduce(1, next);
      } else {
        sm90::wgmma_wait<0>();
        sm90::fence_registers(d[1]);
        release(k);
        reduce(1, cur);
      }
    }
  }
}

template <PrefillKeys K>
__global__ void __launch_bounds__(kThreads<K>, 1)
    prefill_scores_kernel(const __grid_constant__ CUtensorMap key_map, const __grid_constant__ CUtensorMap query_map,
                          const Params p, const Nvfp4Pages fp4) {
  static_assert(registers_fit<K>(), "the producer's and consumers' registers exceed the launch's");
  extern __shared__ std::uint8_t smem_raw[];
  __shared__ __align__(8) std::uint64_t full[kStages], empty[kStages], q_full, q_empty;
  __shared__ StageInfo info[kStages];
  __shared__ Range range;
  std::uint8_t* queries;
  if constexpr (is_nvfp4<K>()) {
    // By pointer arithmetic on smem_raw: visibly shared memory, so that the
    // widening's accesses compile to shared loads and stores.
    queries = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  } else {
    queries = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) &
                                              ~std::uintptr_t(1023));
  }
  std::uint8_t* ring = queries + query_bytes<K>();
  // nvfp4 only, after the key ring: [kRawStages][128][72] raw pages, their
  // full / empty barriers and stage infos.
  std::uint8_t* raw_ring = ring + kStages * key_bytes<K>();
  auto* raw_full = reinterpret_cast<std::uint64_t*>(raw_ring + kRawStages * kRawBytes);
  std::uint64_t* raw_empty = raw_full + kRawStages;
  auto* raw_info = reinterpret_cast<StageInfo*>(raw_empty + kRawStages);
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x < 32) {
    const Range r = cta_range(p, threadIdx.x);
    if (threadIdx.x == 0) {
      range = r;
      for (int s = 0; s < kStages; ++s) {
        // nvfp4 key stages are filled by the widening warps' arrivals.
        sm90::mbar_init(smem_u32(&full[s]), is_nvfp4<K>() ? kWidenWarps : 1);
        sm90::mbar_init(smem_u32(&empty[s]), 32 * kConsumerWarps<K>);
      }
      if constexpr (is_nvfp4<K>()) {
        for (int s = 0; s < kRawStages; ++s) {
          sm90::mbar_init(smem_u32(&raw_full[s]), 1);
          sm90::mbar_init(smem_u32(&raw_empty[s]), kWidenWarps * 32);
        }
      }
      sm90::mbar_init(smem_u32(&q_full), 1);
      sm90::mbar_init(smem_u32(&q_empty), kConsumerWarps<K>);
      sm90::mbar_init_fence();
    }
  }
  __syncthreads();
  const Range r = range;
  if (wg == 0) {
    sm90::regs_dec<kProducerRegs<K>>();
    if constexpr (is_nvfp4<K>()) {
      widen<K>(p, fp4, r, raw_ring, ring, full, empty, raw_full, raw_empty, raw_info, info, tid);
    } else if (tid == 0) {
      produce<K>(p, &key_map, &query_map, r, queries, ring, full, empty, &q_full, &q_empty, info);
    }
  } else {
    sm90::regs_inc<kConsumerRegs<K>>();
    consume<K>(p, fp4.global_scale, &query_map, r, queries, ring, full, empty, &q_full, &q_empty, info, wg - 1, tid);
  }
}

template <PrefillKeys K>
void launch(const CUtensorMap& key_map, const CUtensorMap& query_map, const Params& p, const Nvfp4Pages& fp4, int grid,
            cudaStream_t stream) {
  static std::atomic<std::uint64_t> prepared{0};
  attention::once_per_device(prepared, [](int) {
    MSA_CUDA_CHECK(cudaFuncSetAttribute(prefill_scores_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        smem_bytes<K>()));
  });
  prefill_scores_kernel<K><<<grid, kThreads<K>, smem_bytes<K>(), stream>>>(key_map, query_map, p, fp4);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_prefill_scores(const StepView& step, const IndexerArgs& args, PrefillKeys keys,
                           const CUtensorMap& key_map, const CUtensorMap& query_map, float* scores,
                           std::int32_t max_blocks, std::int32_t block_limit, int grid, std::int64_t* check,
                           cudaStream_t stream) {
  if (block_limit <= 0 || grid <= 0 || step.num_requests <= step.num_decodes) return;
  Params p;
  p.step = step;
  p.table = args.block_table;
  p.num_pages = args.cache.num_pages;
  p.scores = scores;
  p.max_blocks = max_blocks;
  p.block_limit = block_limit;
  p.num_heads = args.num_kv_heads;
  p.check = check;
  Nvfp4Pages fp4;
  if (keys == PrefillKeys::nvfp4_bf16 || keys == PrefillKeys::nvfp4_fp16) {
    fp4.base = static_cast<const std::uint8_t*>(args.cache.base);
    fp4.page_bytes = args.cache.page_stride;  // bytes for nvfp4
  }
  if (args.cache.dtype == DType::nvfp4) fp4.global_scale = args.cache.global_scale;
  switch (keys) {
    case PrefillKeys::bf16: launch<PrefillKeys::bf16>(key_map, query_map, p, fp4, grid, stream); break;
    case PrefillKeys::e4m3: launch<PrefillKeys::e4m3>(key_map, query_map, p, fp4, grid, stream); break;
    case PrefillKeys::nvfp4_bf16: launch<PrefillKeys::nvfp4_bf16>(key_map, query_map, p, fp4, grid, stream); break;
    case PrefillKeys::nvfp4_fp16: launch<PrefillKeys::nvfp4_fp16>(key_map, query_map, p, fp4, grid, stream); break;
    case PrefillKeys::widened_bf16: launch<PrefillKeys::widened_bf16>(key_map, query_map, p, fp4, grid, stream); break;
    case PrefillKeys::widened_fp16: launch<PrefillKeys::widened_fp16>(key_map, query_map, p, fp4, grid, stream); break;
  }
}

}  // namespace msa::cuda::indexer
