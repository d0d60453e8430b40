// Block scores of the decode / verify rows (contract 5) at the rate the index
// cache can be read.
//
// Work: a "unit" is up to 32 rows of one decode request (its decode_query_len
// tokens x H heads; more rows make several units). Every unit sees blocks
// 0 .. (seq_len - 1) / 128 (capped at block_limit), and the (unit, block) pairs
// of the step, in order, are one list that the grid cuts into equal contiguous
// ranges: one persistent CTA per SM, whatever the batch and the lengths, so a
// single long request spreads over every SM and a large batch keeps each CTA
// on one or two requests.
//
// A CTA is one producer warp and 6 (bf16), 8 (fp8) or 11 (nvfp4) consumer
// warps around a ring of shared-memory stages, one page of index keys each,
// bulk-copied as it lies in memory (a page is contiguous: one copy of it reads faster than the two
// 128-byte-swizzled tensor boxes a bf16 page takes), with full / empty
// mbarriers. Consumer warp w of n takes the CTA's blocks w, w + n, ...
// and scores all 128 keys of a block against the unit's rows with mma.sync:
// the keys are the M side (8 m-tiles of 16), the unit's rows the N side (1-4
// n-tiles of 8, their fragments kept in registers while the unit lasts), so a
// block is read from memory once for every row of its request (the loop is
// compiled per n-tile count, and without the causal selects for all but a
// request's last block). The block's "max" is a running max over the m-tiles,
// reduced over the warp at the end; each row's score is written once. The
// top-k follows in select.cu.
//
// Key formats: each lane loads 32 features of two keys of an m-tile from the
// page's rows; bf16 multiplies as loaded on bf16 tensor cores (fp16 queries as
// bf16 hi + lo); fp8 e4m3 and nvfp4 are converted to fp16 in registers
// (exactly, nvfp4 group scales included) on fp16 tensor cores, with the query
// in fp16 (Unit says how each query dtype gets there). The features of a
// k-step are then a permuted set, the same for the query.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include <cuda_fp16.h>

#include "cuda/attention/host/prepare_once.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma.cuh"
#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/indexer/decode_scores.hpp"
#include "cuda/indexer/mma.cuh"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

using ::msa::cuda::smem_u32;
namespace sm90 = ::msa::cuda::sm90;

constexpr int kRingBytes = 192 * 1024;

template <DecodeKeys K>
constexpr int block_bytes() {
  return K == DecodeKeys::bf16 ? 32768 : K == DecodeKeys::e4m3 ? 16384 : int(index_nvfp4::kPageBytes);
}
template <DecodeKeys K>
constexpr int stage_bytes() {
  return (block_bytes<K>() + 1023) / 1024 * 1024;
}
// Consumer warps: 11 for nvfp4 (with the producer, three per SM sub-partition,
// the most that leave each its 168 registers: its conversions are long chains
// of dependent instructions), 8 for fp8 (a page carries half of bf16's bytes
// for the same conversions and MMAs per key, so more warps keep the loads
// going; 8 stages against 6 consumers' 12), 6 for bf16. Warp w of n
// takes the CTA's blocks w, w + n, ..., and the stages are a multiple of n, so
// that stage s only ever has warp s % n as its consumer: a warp waits on a
// stage's fill only after it consumed the stage's previous fill itself. (With
// another consumer in between, that fill might not have landed yet, and the
// full barrier's parity would read a fill two rounds back as this one.)
template <DecodeKeys K>
constexpr int num_consumers() {
  return K == DecodeKeys::nvfp4 ? 11 : K == DecodeKeys::e4m3 ? 8 : 6;
}
template <DecodeKeys K>
constexpr int num_stages() {
  return kRingBytes / stage_bytes<K>() / num_consumers<K>() * num_consumers<K>();
}
static_assert(num_stages<DecodeKeys::bf16>() >= num_consumers<DecodeKeys::bf16>() &&
                  num_stages<DecodeKeys::e4m3>() >= num_consumers<DecodeKeys::e4m3>() &&
                  num_stages<DecodeKeys::nvfp4>() >= num_consumers<DecodeKeys::nvfp4>(),
              "a stage for every consumer warp");
template <DecodeKeys K>
constexpr int num_threads() {
  return (num_consumers<K>() + 1) * 32;
}

struct Params {
  StepView step;
  const std::uint8_t* q = nullptr;     // [num_tokens, H, 128] index queries (2 or 1 bytes each)
  const std::uint8_t* keys = nullptr;  // index cache base (bytes)
  std::int64_t page_bytes = 0;
  std::int64_t num_pages = 0;
  BlockTable table;
  float* scores = nullptr;  // [num_tokens, H, max_blocks]
  std::int32_t max_blocks = 0;
  std::int32_t block_limit = 0;
  std::int32_t num_heads = 0;
  DecodeScoreLaunch l;
  float global_scale = 1.0f;
  std::int64_t* check = nullptr;  // [8] DeviceCheck buffer or null
};

// Blocks of unit u: those of its request, 0 when the request is padding.
__device__ __forceinline__ std::int32_t unit_blocks(const Params& p, std::int32_t u) {
  const std::int32_t seq = p.step.seq_lens[u / p.l.units_per_request];
  return seq <= 0 ? 0 : min((seq - 1) / kBlockSize + 1, p.block_limit);
}

// Where a CTA starts in the step's (unit, block) list, and how many it takes.
struct Range {
  std::int32_t unit, block, count;
};

// Warp-wide: the CTA's share of the list (equal contiguous ranges).
__device__ Range cta_range(const Params& p, int lane) {
  std::int64_t total = 0;
  for (std::int32_t u0 = 0; u0 < p.l.num_units; u0 += 32) {
    std::int32_t n = u0 + lane < p.l.num_units ? unit_blocks(p, u0 + lane) : 0;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) n += __shfl_xor_sync(0xffffffffu, n, m);
    total += n;
  }
  const std::int64_t per = (total + gridDim.x - 1) / gridDim.x;
  const std::int64_t first = min(total, per * std::int64_t(blockIdx.x));
  Range r{p.l.num_units, 0, std::int32_t(min(total, first + per) - first)};
  // The unit holding entry `first`: scan the prefix 32 units at a time.
  std::int64_t before = 0;
  for (std::int32_t u0 = 0; u0 < p.l.num_units && r.count > 0; u0 += 32) {
    const std::int32_t n = u0 + lane < p.l.num_units ? unit_blocks(p, u0 + lane) : 0;
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
      const std::int32_t excl = __shfl_sync(0xffffffffu, incl - n, src);
      r.unit = u0 + src;
      r.block = std::int32_t(first - before - excl);
      break;
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return r;
}

// What the producer tells the consumer of a stage.
struct StageInfo {
  std::int32_t unit, block, page_ok;
};

// ---- the producer ----------------------------------------------------------------
// The whole producer warp walks the CTA's range; lane 0 issues. Page ids are
// read 32 at a time (one coalesced load of a run of the unit's block-table
// row), so that no block waits on a dependent load of its page id.
template <DecodeKeys K>
__device__ void produce(const Params& p, const Range& range, std::uint8_t* ring,
                        std::uint64_t* full, std::uint64_t* empty, StageInfo* info, int lane) {
  constexpr int S = num_stages<K>();
  std::int32_t u = range.unit, b = range.block, nb = range.count > 0 ? unit_blocks(p, u) : 0;
  for (std::int32_t k = 0; k < range.count;) {
    const std::int32_t r = u / p.l.units_per_request;
    const std::int32_t run = min(min(32, nb - b), range.count - k);
    const std::int32_t page_of_lane = lane < run ? p.table.at(r, b + lane) : -1;
    for (std::int32_t i = 0; i < run; ++i, ++k) {
      const std::int32_t page = __shfl_sync(0xffffffffu, page_of_lane, i);
      if (lane != 0) continue;
      const int s = k % S;
      sm90::mbar_wait(smem_u32(&empty[s]), ((k / S) & 1) ^ 1);
      const bool ok = page >= 0 && page < p.num_pages;
      info[s] = StageInfo{u, b + i, ok ? 1 : 0};
      const std::uint32_t bar = smem_u32(&full[s]);
      const std::uint32_t dst = smem_u32(ring + s * stage_bytes<K>());
      if (!ok) {
        detail::record_bad(p.check, detail::kBadIndexBlockTable, r, b + i, 0, page, p.num_pages);
        sm90::mbar_arrive(bar);
      } else {
        sm90::mbar_arrive_expect_tx(bar, block_bytes<K>());
        sm90::bulk_load(dst, p.keys + std::int64_t(page) * p.page_bytes, block_bytes<K>(), bar);
      }
    }
    __syncwarp();
    b += run;
    if (b == nb) {
      do {
        ++u;
      } while (u < p.l.num_units && (nb = unit_blocks(p, u)) == 0);
      b = 0;
    }
  }
}

// ---- the consumers ---------------------------------------------------------------
// The unit a consumer warp is scoring: its rows' query fragments and positions.
// Lane (g, c) holds, per n-tile nt, the fragments of row nt * 8 + g and the
// positions of rows nt * 8 + 2c, + 1 (the accumulator's columns).
//
// bf16 keys multiply on bf16 tensor cores (fp16 queries split into bf16 hi +
// lo). The other formats are converted to fp16 in registers and multiply on
// fp16 tensor cores: e4m3 keys in one cvt per pair; nvfp4 codes by placing
// their bits in an fp16 (value times 2^-14, e2m1x8_to_f16x2_scaled), times the
// group scale times 2^7, exact. Their queries become fp16 once per unit: e4m3
// and fp16 exactly, bf16 times a power of two per row that brings its largest
// finite |value| to [2^14, 2^15) (exact but for values 2^31 below it), the
// power undone on the block max.
template <DecodeKeys K, DecodeQuery Q>
struct Unit {
  static constexpr bool kConvert = K != DecodeKeys::bf16;  // keys converted to fp16
  static constexpr int kSteps = 8;                          // k16 steps per key
  static constexpr int kParts = !kConvert && Q == DecodeQuery::fp16 ? 2 : 1;  // bf16 hi + lo
  // n-tiles a unit may have (DecodeScoreLaunch::max_unit_rows).
  static constexpr int kNTiles = DecodeScoreLaunch::max_unit_rows(Q) / 8;

  std::int32_t id = -1;
  std::int32_t row0 = 0;      // first row (t * H + h) of the unit
  std::int32_t ntiles = 0;
  std::int32_t min_pos = 0;   // the unit's lowest position (its first row)
  std::int32_t pos[kNTiles][2];      // -1: no such row
  float out_scale[kNTiles][2];       // what a column's block max is multiplied by
  std::uint32_t b[kNTiles][kParts][kSteps][2];

  __device__ void load(const Params& p, std::int32_t u, int g, int c) {
    id = u;
    const std::int32_t r = u / p.l.units_per_request;
    const std::int32_t slice = u - r * p.l.units_per_request;
    const std::int32_t req_rows = p.step.decode_query_len * p.num_heads;
    const std::int32_t first = slice * p.l.unit_rows;
    const std::int32_t rows = min(p.l.unit_rows, req_rows - first);
    row0 = p.step.query_start[r] * p.num_heads + first;
    ntiles = (rows + 7) / 8;
    const std::int32_t seq = p.step.seq_lens[r];
    const std::int32_t pos0 = seq - p.step.decode_query_len;  // position of the request's first token
    min_pos = pos0 + first / p.num_heads;
    // nvfp4 keys carry 2^-14 * 2^7 (see above) and the cache's global scale.
    const float key_scale = K == DecodeKeys::nvfp4 ? p.global_scale * 128.0f : 1.0f;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const std::int32_t i = nt * 8 + 2 * c + e;
        pos[nt][e] = i < rows && seq > 0 ? pos0 + (first + i) / p.num_heads : -1;
      }
      const std::int32_t i = nt * 8 + g;
      const bool have = nt < ntiles && i < rows;
      const std::int64_t row = std::int64_t(row0) + i;
      float row_scale = 1.0f;  // of row nt * 8 + g
      if constexpr (kConvert) {
        std::uint32_t h[16];  // fp16 pairs of features 32c + 2j, + 1
        load_query_f16(p, row, have, c, h, row_scale);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          if constexpr (K == DecodeKeys::e4m3) {
            // k-step s: features 32c + 4s .. + 3, the order the keys convert in.
            b[nt][0][s][0] = h[2 * s];
            b[nt][0][s][1] = h[2 * s + 1];
          } else {
            // k-step s: of features 32c + 8 (s / 2) + 0 .. 7, elements (0, 2) and (4, 6)
            // for even s, (1, 3) and (5, 7) for odd s: e2m1x8_to_f16x2_scaled's pairs.
            const int w = 4 * (s >> 1);
            const std::uint32_t sel = (s & 1) ? 0x7632u : 0x5410u;
            b[nt][0][s][0] = byte_perm(h[w], h[w + 1], sel);
            b[nt][0][s][1] = byte_perm(h[w + 2], h[w + 3], sel);
          }
        }
      } else {
        // The order the keys load in (mma_mtile): 16-byte chunk (i + (c & 2)) & 3
        // of lane c's 64 bytes for k-steps 2i and 2i + 1, words (0, 1) and (2, 3).
        const uint4* src = reinterpret_cast<const uint4*>(p.q + (row * kHeadDim + 32 * c) * 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 v = have ? __ldg(src + ((i + (c & 2)) & 3)) : make_uint4(0, 0, 0, 0);
          const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int s = 2 * i + h;
            if constexpr (Q == DecodeQuery::fp16) {
              fp16x2_to_bf16x2_split(w[2 * h], b[nt][0][s][0], b[nt][1][s][0]);
              fp16x2_to_bf16x2_split(w[2 * h + 1], b[nt][0][s][1], b[nt][1][s][1]);
            } else {
              b[nt][0][s][0] = w[2 * h];
              b[nt][0][s][1] = w[2 * h + 1];
            }
          }
        }
      }
      // Column e of this lane is row nt * 8 + 2c + e, held by lanes 4 (2c + e) ...
#pragma unroll
      for (int e = 0; e < 2; ++e)
        out_scale[nt][e] = __shfl_sync(0xffffffffu, row_scale, (2 * c + e) * 4) * key_scale;
    }
  }

  // Lane c's 32 features 32c .. 32c + 31 of query row `row` as fp16 pairs
  // (zeros when !have), and the factor that undoes their scaling.
  //   h: [16] fp16x2
  __device__ static void load_query_f16(const Params& p, std::int64_t row, bool have, int c,
                                        std::uint32_t (&h)[16], float& undo) {
    undo = 1.0f;
    if constexpr (Q == DecodeQuery::e4m3) {
      const uint4* src = reinterpret_cast<const uint4*>(p.q + row * kHeadDim + 32 * c);
      const uint4 v0 = have ? __ldg(src) : make_uint4(0, 0, 0, 0);
      const uint4 v1 = have ? __ldg(src + 1) : make_uint4(0, 0, 0, 0);
      const std::uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        h[2 * i] = e4m3x2_to_f16x2(w[i] & 0xFFFFu);
        h[2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
      }
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(p.q + (row * kHeadDim + 32 * c) * 2);
      std::uint32_t w[16];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = have ? __ldg(src + i) : make_uint4(0, 0, 0, 0);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
      }
      if constexpr (Q == DecodeQuery::fp16) {
#pragma unroll
        for (int i = 0; i < 16; ++i) h[i] = w[i];
      } else {
        // The row's largest finite |value| over the 4 lanes that hold it.
        float big = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float lo = fabsf(__uint_as_float(w[i] << 16)), hi = fabsf(__uint_as_float(w[i] & 0xFFFF0000u));
          if (lo < INFINITY) big = fmaxf(big, lo);
          if (hi < INFINITY) big = fmaxf(big, hi);
        }
        big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 1));
        big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, 2));
        // 2^shift brings big to [2^14, 2^15); capped so that 2^shift and 2^-shift are floats.
        const int shift = big > 0.0f ? min(14 - ilogbf(big), 120) : 0;
        const float up = exp2f(float(shift));
        undo = exp2f(float(-shift));
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const __half2 v = __floats2half2_rn(__uint_as_float(w[i] << 16) * up, __uint_as_float(w[i] & 0xFFFF0000u) * up);
          std::memcpy(&h[i], &v, sizeof(v));
        }
      }
    }
  }
};

// Shared-memory loads at a shared-window address (no generic-address path).
__device__ __forceinline__ uint4 lds128(std::uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(std::uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ std::uint32_t lds16(std::uint32_t addr) {
  std::uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(addr));
  return v;
}

// acc[s % kChains][nt] += keys (m-tile `mt` of the stage) . rows of n-tile nt
// over k-step s, for the unit's first NT n-tiles. Two chains of accumulators
// (even and odd k-steps), so that a block of one n-tile does not pay the
// tensor cores' latency eight times in a row per m-tile: a small step's last
// blocks wait on that latency, and nvfp4's conversions would wait behind it.
constexpr int kChains = 2;
template <int NT, DecodeKeys K, DecodeQuery Q>
__device__ __forceinline__ void mma_mtile(const Unit<K, Q>& un, const std::uint8_t* stage, int mt, int lane,
                                          float (&acc)[kChains][NT][4]) {
  using U = Unit<K, Q>;
  const int g = lane >> 2, c = lane & 3;
  auto mma_all = [&](int s, std::uint32_t a0, std::uint32_t a1, std::uint32_t a2, std::uint32_t a3) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if constexpr (U::kConvert) {
        mma_f16_16816(acc[s % kChains][nt], a0, a1, a2, a3, un.b[nt][0][s][0], un.b[nt][0][s][1]);
      } else {
#pragma unroll
        for (int part = 0; part < U::kParts; ++part)
          mma_bf16_16816(acc[s % kChains][nt], a0, a1, a2, a3, un.b[nt][part][s][0], un.b[nt][part][s][1]);
      }
    }
  };
  // Lane (g, c) loads (and converts) features 32c .. 32c + 31 of keys g and g + 8.
  std::uint32_t f[2][16];  // [key][bf16 / fp16 pairs, in the order of the query's k-steps]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = mt * 16 + g + 8 * half;
    if constexpr (K == DecodeKeys::bf16) {
      // 64 bytes of the 256-byte row, 16-byte chunk (i + (c & 2)) & 3 at step i:
      // the eight lanes of a load phase then meet four bank groups, not two.
      const std::uint32_t row = smem_u32(stage) + key * 256 + 64 * c;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = lds128(row + 16 * ((i + (c & 2)) & 3));
        f[half][4 * i] = v.x, f[half][4 * i + 1] = v.y, f[half][4 * i + 2] = v.z, f[half][4 * i + 3] = v.w;
      }
    } else {
      if constexpr (K == DecodeKeys::e4m3) {
        // 32 codes: chunks 2c and 2c + 1 of the 128-byte row.
        const std::uint32_t row = smem_u32(stage) + key * 128;
        const uint4 lo = lds128(row + ((2 * c) << 4));
        const uint4 hi = lds128(row + ((2 * c + 1) << 4));
        const std::uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          f[half][2 * i] = e4m3x2_to_f16x2(w[i] & 0xFFFFu);
          f[half][2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
        }
      } else {
        // nvfp4 row: 64 data bytes (bytes 16c .. 16c + 15 hold features 32c ..),
        // then 8 group scales (groups 2c, 2c + 1 cover those features).
        const std::uint32_t row = smem_u32(stage) + key * std::uint32_t(index_nvfp4::kRowBytes);
        const uint2 d0 = lds64(row + 16 * c);
        const uint2 d1 = lds64(row + 16 * c + 8);
        // Both group scales as fp16, times 2^7 (exact: at most 448 * 128).
        const std::uint32_t sc = f16x2_mul(
            e4m3x2_to_f16x2(lds16(row + std::uint32_t(index_nvfp4::kDataBytes) + 2 * c)), 0x58005800u);
        const std::uint32_t s0 = byte_perm(sc, 0u, 0x1010u), s1 = byte_perm(sc, 0u, 0x3232u);
        const std::uint32_t w[4] = {d0.x, d0.y, d1.x, d1.y};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          std::uint32_t v[4];
          e2m1x8_to_f16x2_scaled(w[i], v);
#pragma unroll
          for (int j = 0; j < 4; ++j) f[half][4 * i + j] = f16x2_mul(v[j], i < 2 ? s0 : s1);
        }
      }
    }
  }
  // k-step s: pairs 2s (rows g, g + 8: a0, a1) and 2s + 1 (a2, a3).
#pragma unroll
  for (int s = 0; s < 8; ++s) mma_all(s, f[0][2 * s], f[1][2 * s], f[0][2 * s + 1], f[1][2 * s + 1]);
}

// The NaN-lowest max of each of the unit's first NT n-tiles' columns over the
// 128 keys of a stage, keys past a column's position NaN when Masked (only
// the request's last block needs it, so the others skip the selects).
//   mx: [kNTiles][2] running max per accumulator column pair (in and out)
template <int NT, bool Masked, DecodeKeys K, DecodeQuery Q>
__device__ __forceinline__ void block_max(const Unit<K, Q>& un, const std::uint8_t* stage, std::int32_t first_key,
                                          int lane, float (&mx)[Unit<K, Q>::kNTiles][2]) {
  const float kNaN = __int_as_float(0x7FFFFFFF);
  const int g = lane >> 2;
#pragma unroll 1
  for (int mt = 0; mt < 8; ++mt) {
    float acc[kChains][NT][4] = {};
    mma_mtile<NT, K, Q>(un, stage, mt, lane, acc);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][nt][i] += acc[1][nt][i];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v0 = acc[0][nt][e], v1 = acc[0][nt][2 + e];  // keys g, g + 8 of the m-tile
        if constexpr (Masked) {
          const std::int32_t lim = un.pos[nt][e] - first_key;
          if (mt * 16 + g > lim) v0 = kNaN;
          if (mt * 16 + g + 8 > lim) v1 = kNaN;
        }
        mx[nt][e] = fmaxf(mx[nt][e], fmaxf(v0, v1));
      }
    }
  }
}

// block_max for the unit's n-tile count (3 runs as 4: its fourth has zero queries).
template <bool Masked, DecodeKeys K, DecodeQuery Q>
__device__ __forceinline__ void block_max_any(const Unit<K, Q>& un, const std::uint8_t* stage, std::int32_t first_key,
                                              int lane, float (&mx)[Unit<K, Q>::kNTiles][2]) {
  constexpr int kMax = Unit<K, Q>::kNTiles;
  if (un.ntiles == 1) block_max<1, Masked>(un, stage, first_key, lane, mx);
  else if (un.ntiles == 2) block_max<2, Masked>(un, stage, first_key, lane, mx);
  else block_max<kMax, Masked>(un, stage, first_key, lane, mx);
}

template <DecodeKeys K, DecodeQuery Q>
__device__ void consume(const Params& p, const Range& range, const std::uint8_t* ring, std::uint64_t* full,
                        std::uint64_t* empty, const StageInfo* info, int warp, int lane) {
  constexpr int S = num_stages<K>();
  const float kNaN = __int_as_float(0x7FFFFFFF);
  const int g = lane >> 2, c = lane & 3;
  constexpr int kMaxNTiles = Unit<K, Q>::kNTiles;
  Unit<K, Q> un;
  // The CTA's first unit, loaded while the first pages are on their way (the
  // unit of most warps' first block; a warp whose first block is not in it
  // loads its own below).
  if (warp < range.count) un.load(p, range.unit, g, c);
  for (std::int32_t k = warp; k < range.count; k += num_consumers<K>()) {
    const int s = k % S;
    sm90::mbar_wait(smem_u32(&full[s]), (k / S) & 1);
    const StageInfo si = info[s];
    if (si.unit != un.id) un.load(p, si.unit, g, c);
    const std::int32_t first_key = si.block * kBlockSize;
    // NaN-lowest running max per accumulator column (row) pair.
    float mx[kMaxNTiles][2];
#pragma unroll
    for (int nt = 0; nt < kMaxNTiles; ++nt) mx[nt][0] = mx[nt][1] = kNaN;
    if (si.page_ok) {
      const std::uint8_t* stage = ring + s * stage_bytes<K>();
      // Rows that see only part of the block: the request's last block.
      if (first_key + kBlockSize - 1 > un.min_pos) block_max_any<true>(un, stage, first_key, lane, mx);
      else block_max_any<false>(un, stage, first_key, lane, mx);
    }
    // The stage is free once every lane has read it.
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(smem_u32(&empty[s]));
#pragma unroll
    for (int nt = 0; nt < kMaxNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int m = 4; m <= 16; m <<= 1) mx[nt][e] = fmaxf(mx[nt][e], __shfl_xor_sync(0xffffffffu, mx[nt][e], m));
      }
    }
    if (g == 0) {
#pragma unroll
      for (int nt = 0; nt < kMaxNTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const std::int32_t pos = un.pos[nt][e];
          if (nt >= un.ntiles || pos < 0) continue;
          float v = mx[nt][e];
          if (first_key > pos) v = -INFINITY;  // beyond the row's own block
          else v *= un.out_scale[nt][e];
          p.scores[(std::int64_t(un.row0) + nt * 8 + 2 * c + e) * p.max_blocks + si.block] = v;
        }
      }
    }
  }
}

template <DecodeKeys K, DecodeQuery Q>
__global__ void __launch_bounds__(num_threads<K>(), 1)
    decode_scores_kernel(const Params p) {
  constexpr int S = num_stages<K>();
  extern __shared__ std::uint8_t smem_raw[];
  __shared__ __align__(8) std::uint64_t full[S], empty[S];
  __shared__ StageInfo info[S];
  __shared__ Range range;
  std::uint8_t* ring = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) &
                                                       ~std::uintptr_t(1023));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kProducer = num_consumers<K>();  // the last warp
  if (warp == kProducer) {
    const Range r = cta_range(p, lane);
    if (lane == 0) {
      range = r;
      for (int s = 0; s < S; ++s) {
        sm90::mbar_init(smem_u32(&full[s]), 1);
        sm90::mbar_init(smem_u32(&empty[s]), 1);
      }
      sm90::mbar_init_fence();
    }
  }
  __syncthreads();
  const Range r = range;
  if (warp == kProducer) {
    produce<K>(p, r, ring, full, empty, info, lane);
  } else {
    consume<K, Q>(p, r, ring, full, empty, info, warp, lane);
  }
}

template <DecodeKeys K, DecodeQuery Q>
void launch(const Params& p, int grid, cudaStream_t stream) {
  constexpr int smem = kRingBytes + 1024;
  static std::atomic<std::uint64_t> prepared{0};
  attention::once_per_device(prepared, [](int) {
    MSA_CUDA_CHECK(cudaFuncSetAttribute(decode_scores_kernel<K, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  });
  decode_scores_kernel<K, Q><<<grid, num_threads<K>(), smem, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_decode_scores(const StepView& step, const IndexerArgs& args, DecodeKeys keys, DecodeQuery query,
                          float* scores, std::int32_t max_blocks, std::int32_t block_limit,
                          const DecodeScoreLaunch& launch_args, int grid, std::int64_t* check, cudaStream_t stream) {
  if (launch_args.num_units <= 0 || block_limit <= 0 || grid <= 0) return;
  Params p;
  p.step = step;
  p.q = static_cast<const std::uint8_t*>(args.index_q);
  p.keys = static_cast<const std::uint8_t*>(args.cache.base);
  p.page_bytes = keys == DecodeKeys::nvfp4 ? args.cache.page_stride
                                           : args.cache.page_stride * (keys == DecodeKeys::bf16 ? 2 : 1);
  p.num_pages = args.cache.num_pages;
  p.table = args.block_table;
  p.scores = scores;
  p.max_blocks = max_blocks;
  p.block_limit = block_limit;
  p.num_heads = args.num_kv_heads;
  p.l = launch_args;
  p.global_scale = args.cache.global_scale;
  p.check = check;
  using DK = DecodeKeys;
  using DQ = DecodeQuery;
  switch (keys) {
    case DK::bf16:
      if (query == DQ::fp16) launch<DK::bf16, DQ::fp16>(p, grid, stream);
      else launch<DK::bf16, DQ::bf16>(p, grid, stream);
      break;
    case DK::e4m3:
      if (query == DQ::e4m3) launch<DK::e4m3, DQ::e4m3>(p, grid, stream);
      else if (query == DQ::fp16) launch<DK::e4m3, DQ::fp16>(p, grid, stream);
      else launch<DK::e4m3, DQ::bf16>(p, grid, stream);
      break;
    case DK::nvfp4:
      if (query == DQ::fp16) launch<DK::nvfp4, DQ::fp16>(p, grid, stream);
      else launch<DK::nvfp4, DQ::bf16>(p, grid, stream);
      break;
  }
}

}  // namespace msa::cuda::indexer
