// Mainloop of the attention kernels: keys of one staged 128-key block against
// a warp's 16 query rows. In the row kernel warp w owns keys [32w, 32w + 32)
// of every block and keeps its own online-softmax state (running max, sum,
// 16 x 128 fp32 output); the epilogue merges the four warps. In the token-tile
// kernel a warp owns 16 rows and takes all 128 keys, in one pass or two.
//
// QK^T and PV are mma.sync m16n8k16 with fp32 accumulators; K fragments come
// from ldmatrix, V fragments from ldmatrix.trans, and the probabilities are
// reused as the A operand straight from the score registers.
#pragma once

#include <cstdint>

#include "cuda/common/fp4_fragments.hpp"
#include "cuda/common/fp8_fragments.hpp"
#include "cuda/attention/format.cuh"
#include "cuda/attention/mma_sync/smem.cuh"
#include "cuda/attention/params.cuh"
#include "cuda/attention/shared/convert.cuh"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

struct WarpState {
  float o[16][4];  // 16 n-tiles of 8 dims: rows lane/4 (0, 1) and lane/4 + 8 (2, 3)
  float m[2];      // running max (log2 units) of rows lane/4 and lane/4 + 8
  float l[2];      // running sum of this thread's columns (reduced over the quad at the end)

  __device__ void init() {
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }
};

// Query fragments (A operand) of the 8 k-steps from the swizzled query tile.
//   q_tile: shared address of [16][128] MMA-type rows
__device__ __forceinline__ void load_query_fragments(std::uint32_t (&qf)[8][4], std::uint32_t q_tile,
                                                     int lane) {
  const int row = (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) ldmatrix_x4(qf[ks], q_tile + tile_offset(row, 2 * ks + (lane >> 4)));
}

// The scores of keys [key_base, key_base + 8 * kKeyTiles) to probabilities:
// log2 units, per-token K scales, causal / selection mask, the online softmax
// update of the warp's state (O rescaled), per-token V scales on the result.
//   s: [kKeyTiles][4] accumulators, n-tile j = keys key_base + 8 j ..
//   scale_log2: the score scale of the thread's rows lane / 4 and lane / 4 + 8
template <int kKeyTiles>
__device__ __forceinline__ void scores_to_probs(WarpState& st, float (&s)[kKeyTiles][4], int key_base, int lane,
                                                const float (&scale_log2)[2], const int (&limit)[2],
                                                const float* k_scales, const float* v_scales) {
  // Scale to log2 units, per-token K scales, causal / selection mask.
  const int col0 = key_base + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = col0 + 8 * j + (e & 1);
      float x = s[j][e] * scale_log2[e >> 1];
      if (k_scales != nullptr) x *= k_scales[key];
      s[j][e] = key < limit[e >> 1] ? x : -INFINITY;
    }
  }

  // Online softmax per row (two rows per thread, a row spread over a quad).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m[i], mx);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = fast_exp2(st.m[i] - m_use);
    st.m[i] = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j) {
      s[j][2 * i] = fast_exp2(s[j][2 * i] - m_use);
      s[j][2 * i + 1] = fast_exp2(s[j][2 * i + 1] - m_use);
      sum += s[j][2 * i] + s[j][2 * i + 1];
    }
    st.l[i] = st.l[i] * alpha + sum;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      st.o[n][2 * i] *= alpha;
      st.o[n][2 * i + 1] *= alpha;
    }
  }

  // Per-token V scales go on the probabilities (the sum above stays unscaled).
  if (v_scales != nullptr) {
#pragma unroll
    for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] *= v_scales[col0 + 8 * j + (e & 1)];
  }
}

// The probabilities of k-step kk (keys 16 kk .. 16 kk + 15 of the score
// tiles, n-tiles 2 kk and 2 kk + 1) as the PV MMA's A fragment, straight from
// the accumulator layout.
template <bool kF16, int kKeyTiles>
__device__ __forceinline__ void probs_to_a(const float (&s)[kKeyTiles][4], int kk, std::uint32_t (&a)[4]) {
  a[0] = pack2<kF16>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack2<kF16>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack2<kF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack2<kF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Keys [key_base, key_base + 8 * kKeyTiles) of one staged block against the
// warp's 16 query rows: scores, masking, online softmax, PV. Row r0 = lane / 4
// sees the keys < limit[0] of the block, row r0 + 8 those < limit[1] (0: none).
//   k_tile, v_tile: shared addresses of [128 keys][128] MMA-type tiles
//   k_scales, v_scales: [128] per-token scales in shared memory, or null
template <bool kF16, int kKeyTiles>
__device__ __forceinline__ void attend_keys(WarpState& st, const std::uint32_t (&qf)[8][4],
                                            std::uint32_t k_tile, std::uint32_t v_tile, int key_base,
                                            int lane, float scale_log2, const int (&limit)[2],
                                            const float* k_scales, const float* v_scales) {
  static_assert(kKeyTiles % 2 == 0, "keys come in pairs of 8-key tiles");
  float s[kKeyTiles][4];
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;

  // S = Q K^T over these keys.
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
    for (int jp = 0; jp < kKeyTiles / 2; ++jp) {
      const int key = key_base + (2 * jp + (lane >> 4)) * 8 + (lane & 7);
      std::uint32_t b[4];
      ldmatrix_x4(b, k_tile + tile_offset(key, 2 * ks + ((lane >> 3) & 1)));
      mma16816<kF16>(s[2 * jp], qf[ks], b[0], b[1]);
      mma16816<kF16>(s[2 * jp + 1], qf[ks], b[2], b[3]);
    }
  }

  const float row_scale[2] = {scale_log2, scale_log2};
  scores_to_probs<kKeyTiles>(st, s, key_base, lane, row_scale, limit, k_scales, v_scales);

  // O += P V: k-steps of 16 keys, 16 n-tiles of 8 dims.
#pragma unroll
  for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
    std::uint32_t a[4];
    probs_to_a<kF16>(s, kk, a);
    const int key = key_base + 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int dp = 0; dp < 8; ++dp) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + tile_offset(key, 2 * dp + (lane >> 4)));
      mma16816<kF16>(st.o[2 * dp], a, b[0], b[1]);
      mma16816<kF16>(st.o[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// The row kernel's share of one block: warp w takes keys [32w, 32w + 32), all
// 16 rows see the keys < valid_keys.
template <bool kF16>
__device__ __forceinline__ void attend_block(WarpState& st, const std::uint32_t (&qf)[8][4],
                                             std::uint32_t k_tile, std::uint32_t v_tile, int warp,
                                             int lane, float scale_log2, int valid_keys,
                                             const float* k_scales, const float* v_scales) {
  const int limit[2] = {valid_keys, valid_keys};
  attend_keys<kF16, 4>(st, qf, k_tile, v_tile, warp * 32, lane, scale_log2, limit, k_scales, v_scales);
}

// The row kernel's share of one block read as raw fp8 codes (fp8_fragments.hpp):
// warp w takes keys [32w, 32w + 32) of the raw K / V planes, converts the
// fragments in registers, and accumulates into n-tiles whose dims are
// fp8f::out_dim (the epilogue maps them back). The query fragments come from
// a tile staged with the fp8f::q_source_word permutation.
//   raw_k, raw_v: shared addresses of [128 keys][128 codes] swizzled planes
//   scale_log2: the score scale of the thread's rows lane / 4 and lane / 4 + 8
template <KvKind kKind, bool kF16>
__device__ __forceinline__ void attend_block_fp8(WarpState& st, const std::uint32_t (&qf)[8][4], std::uint32_t raw_k,
                                                 std::uint32_t raw_v, int warp, int lane,
                                                 const float (&scale_log2)[2], int valid_keys, const float* k_scales,
                                                 const float* v_scales) {
  const int key_base = warp * 32;
  float s[4][4] = {};

  // S = Q K^T: k-step pairs (2 jp, 2 jp + 1) x n-tile pairs (2 np, 2 np + 1).
#pragma unroll
  for (int jp = 0; jp < 4; ++jp) {
#pragma unroll
    for (int np = 0; np < 2; ++np) {
      int key = 0, chunk = 0;
      fp8f::k_source(lane, key_base, np, jp, key, chunk);
      std::uint32_t r[4];
      ldmatrix_x4(r, raw_k + std::uint32_t(fp8f::raw_offset(key, chunk)));
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int nt = 2 * np + (m >> 1), ks = 2 * jp + (m & 1);
        mma16816<kF16>(s[nt], qf[ks], fp8x2_to_mma<kKind, kF16>(r[m]), fp8x2_to_mma<kKind, kF16>(r[m] >> 16));
      }
    }
  }

  const int limit[2] = {valid_keys, valid_keys};
  scores_to_probs<4>(st, s, key_base, lane, scale_log2, limit, k_scales, v_scales);

  // O += P V: k-steps of 16 keys; per chunk pair, 4 output n-tiles (even / odd dims).
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    std::uint32_t a[4];
    probs_to_a<kF16>(s, kk, a);
#pragma unroll
    for (int jp = 0; jp < 4; ++jp) {
      int key = 0, chunk = 0;
      fp8f::v_source(lane, key_base, kk, jp, key, chunk);
      std::uint32_t r[4];
      ldmatrix_x4_trans(r, raw_v + std::uint32_t(fp8f::raw_offset(key, chunk)));
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int j = 2 * jp + c;
        const std::uint32_t lo = byte_perm(r[2 * c], fp8f::kPairBytes);
        const std::uint32_t hi = byte_perm(r[2 * c + 1], fp8f::kPairBytes);
        mma16816<kF16>(st.o[2 * j], a, fp8x2_to_mma<kKind, kF16>(lo), fp8x2_to_mma<kKind, kF16>(hi));
        mma16816<kF16>(st.o[2 * j + 1], a, fp8x2_to_mma<kKind, kF16>(lo >> 16), fp8x2_to_mma<kKind, kF16>(hi >> 16));
      }
    }
  }
}

// The row kernel's share of one block read as raw nvfp4 codes
// (fp4_fragments.hpp): warp w takes keys [32w, 32w + 32) of the raw K / V
// slots, converts the fragments in registers and multiplies them by their
// group scales (exact in the MMA type), and accumulates into n-tiles whose
// dims are fp4f::out_dim (the epilogue maps them back). On fp16 MMA the codes
// become fp16 values times 2^-14 (fp4f::e2m1x8_to_f16_high_bytes), the scales
// carry 2^7, and the rest, 2^-7, is undone by the score scale (QK^T) and by
// the probabilities times 2^7 (PV, exact); the query tile is staged for that
// order (fp4f::q_source_pair). On bf16 MMA the codes become exact values
// (e2m1x8_to_pairs) and the query tile follows fp4f::q_source_word.
//   raw_k, raw_v: shared addresses of [128 keys][64 bytes] swizzled data planes
//   k_scales, v_scales: [128 keys][8] e4m3 group scales (shared memory)
//   scale_log2: the score scale of the thread's rows lane / 4 and lane / 4 + 8
template <bool kF16>
__device__ __forceinline__ void attend_block_fp4(WarpState& st, const std::uint32_t (&qf)[8][4], std::uint32_t raw_k,
                                                 std::uint32_t raw_v, const unsigned char* k_scales,
                                                 const unsigned char* v_scales, int warp, int lane,
                                                 const float (&scale_log2)[2], int valid_keys) {
  constexpr std::uint32_t kTwoTo7 = 0x58005800u;  // fp16 (128, 128)
  // A pair of e4m3 scale codes in the MMA type, times 2^7 on fp16.
  const auto scales_to_mma = [](std::uint32_t two_codes) {
    const std::uint32_t x = e4m3_scales_to_mma<kF16>(two_codes);
    return kF16 ? mul2<true>(x, kTwoTo7) : x;
  };
  const int key_base = warp * 32;
  const int q = lane & 3;
  float s[4][4] = {};

  // S = Q K^T: per n-tile, chunk m feeds k-steps 2m and 2m + 1.
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    int key = 0, chunk = 0;
    fp4f::k_source(lane, key_base, nt, key, chunk);
    std::uint32_t r[4];
    ldmatrix_x4(r, raw_k + std::uint32_t(fp4f::raw_offset(key, chunk)));
    // The scales of this lane's key (B column lane / 4), groups 2m + q / 2.
    const uint2 sc8 = *reinterpret_cast<const uint2*>(k_scales + (key_base + 8 * nt + (lane >> 2)) * 8);
    const std::uint32_t sb = fp4f::scale_bytes(sc8.x, sc8.y, q >> 1);
    const std::uint32_t sc01 = scales_to_mma(sb);
    const std::uint32_t sc23 = scales_to_mma(sb >> 16);
    const std::uint32_t sc[4] = {fp4f::prmt(sc01, 0u, 0x1010u), fp4f::prmt(sc01, 0u, 0x3232u),
                                 fp4f::prmt(sc23, 0u, 0x1010u), fp4f::prmt(sc23, 0u, 0x3232u)};
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      std::uint32_t b[4];  // b0, b1 of k-step 2m, then of 2m + 1
      if constexpr (kF16) {
        std::uint32_t even = 0, odd = 0;
        fp4f::e2m1x8_to_f16_high_bytes(r[m], even, odd);
        b[0] = fp4f::prmt(even, 0u, fp4f::kHigh01);
        b[1] = fp4f::prmt(even, 0u, fp4f::kHigh23);
        b[2] = fp4f::prmt(odd, 0u, fp4f::kHigh01);
        b[3] = fp4f::prmt(odd, 0u, fp4f::kHigh23);
      } else {
        fp4f::e2m1x8_to_pairs<kF16>(r[m], b);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = mul2<kF16>(b[i], sc[m]);
      mma16816<kF16>(s[nt], qf[2 * m], b[0], b[1]);
      mma16816<kF16>(s[nt], qf[2 * m + 1], b[2], b[3]);
    }
  }

  const int limit[2] = {valid_keys, valid_keys};
  if constexpr (kF16) {
    const float unscaled[2] = {scale_log2[0] * 128.0f, scale_log2[1] * 128.0f};  // the keys' 2^-7
    scores_to_probs<4>(st, s, key_base, lane, unscaled, limit, nullptr, nullptr);
  } else {
    scores_to_probs<4>(st, s, key_base, lane, scale_log2, limit, nullptr, nullptr);
  }

  // O += P V: k-steps of 16 keys; per chunk, 4 output n-tiles (dims 32c + 4n + e).
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    std::uint32_t a[4];
    probs_to_a<kF16>(s, kk, a);
    if constexpr (kF16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = mul2<true>(a[i], kTwoTo7);  // the values' 2^-7 (P <= 1: exact)
    }
    // Scale pairs (key 2q, key 2q + 1) for b0 and (8 + 2q, 9 + 2q) for b1, of
    // group 2 chunk + lane / 16: vsc[b][chunk].
    std::uint32_t vsc[2][4];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int k0 = key_base + 16 * kk + 8 * b + 2 * q;
      const uint2 s0 = *reinterpret_cast<const uint2*>(v_scales + k0 * 8);
      const uint2 s1 = *reinterpret_cast<const uint2*>(v_scales + (k0 + 1) * 8);
      const std::uint32_t a0 = fp4f::scale_bytes(s0.x, s0.y, lane >> 4);
      const std::uint32_t a1 = fp4f::scale_bytes(s1.x, s1.y, lane >> 4);
      const std::uint32_t lo = fp4f::prmt(a0, a1, 0x5140u), hi = fp4f::prmt(a0, a1, 0x7362u);
      vsc[b][0] = scales_to_mma(lo);
      vsc[b][1] = scales_to_mma(lo >> 16);
      vsc[b][2] = scales_to_mma(hi);
      vsc[b][3] = scales_to_mma(hi >> 16);
    }
#pragma unroll
    for (int cp = 0; cp < 2; ++cp) {
      int key = 0, chunk = 0;
      fp4f::v_source(lane, key_base, kk, cp, key, chunk);
      std::uint32_t r[4];
      ldmatrix_x4_trans(r, raw_v + std::uint32_t(fp4f::raw_offset(key, chunk)));
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int c = 2 * cp + cc;
        if constexpr (kF16) {
          std::uint32_t even0 = 0, odd0 = 0, even1 = 0, odd1 = 0;
          fp4f::e2m1x8_to_f16_high_bytes(r[2 * cc], even0, odd0);
          fp4f::e2m1x8_to_f16_high_bytes(r[2 * cc + 1], even1, odd1);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const std::uint32_t sel = e < 2 ? fp4f::kHigh02 : fp4f::kHigh13;
            const std::uint32_t b0 = mul2<true>(fp4f::prmt((e & 1) ? odd0 : even0, 0u, sel), vsc[0][c]);
            const std::uint32_t b1 = mul2<true>(fp4f::prmt((e & 1) ? odd1 : even1, 0u, sel), vsc[1][c]);
            mma16816<kF16>(st.o[4 * c + e], a, b0, b1);
          }
        } else {
          std::uint32_t p0[4], p1[4];
          fp4f::e2m1x8_to_pairs<kF16>(r[2 * cc], p0);
          fp4f::e2m1x8_to_pairs<kF16>(r[2 * cc + 1], p1);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const std::uint32_t sel = (e & 1) ? fp4f::kPairHigh : fp4f::kPairLow;
            const std::uint32_t b0 = mul2<kF16>(fp4f::prmt(p0[e >> 1], p0[2 + (e >> 1)], sel), vsc[0][c]);
            const std::uint32_t b1 = mul2<kF16>(fp4f::prmt(p1[e >> 1], p1[2 + (e >> 1)], sel), vsc[1][c]);
            mma16816<kF16>(st.o[4 * c + e], a, b0, b1);
          }
        }
      }
    }
  }
}

// The row kernel's block, per format (Format<kKind>::RowBlock): one staged
// block of the stager's stage `stage`, keys < valid_keys.
//   row_scale: the score scale of the thread's rows lane / 4 and lane / 4 + 8
struct HalfRowBlock {
  template <KvKind kKind, bool kF16, class Stager>
  __device__ __forceinline__ static void attend(WarpState& st, const std::uint32_t (&qf)[8][4], const Stager& stager,
                                                int stage, int warp, int lane, const float (&row_scale)[2],
                                                int valid_keys, const AttendParams& p) {
    (void)row_scale;  // a 16-bit query tile is not scaled: the step's score scale
    attend_block<kF16>(st, qf, stager.k_tile(stage), stager.v_tile(stage), warp, lane, p.score_scale_log2, valid_keys,
                       stager.k_token_scales(), stager.v_token_scales());
  }
};
struct Fp8RowBlock {
  template <KvKind kKind, bool kF16, class Stager>
  __device__ __forceinline__ static void attend(WarpState& st, const std::uint32_t (&qf)[8][4], const Stager& stager,
                                                int stage, int warp, int lane, const float (&row_scale)[2],
                                                int valid_keys, const AttendParams&) {
    const float* scales = stager.stage_scales(stage);
    attend_block_fp8<kKind, kF16>(st, qf, stager.raw_k(stage), stager.raw_v(stage), warp, lane, row_scale, valid_keys,
                                  scales, scales != nullptr ? scales + kBlockKeys : nullptr);
  }
};
struct Fp4RowBlock {
  template <KvKind kKind, bool kF16, class Stager>
  __device__ __forceinline__ static void attend(WarpState& st, const std::uint32_t (&qf)[8][4], const Stager& stager,
                                                int stage, int warp, int lane, const float (&row_scale)[2],
                                                int valid_keys, const AttendParams&) {
    attend_block_fp4<kF16>(st, qf, stager.raw_k(stage), stager.raw_v(stage),
                           stager.raw_k_bytes(stage) + fp4f::kScaleOffset,
                           stager.raw_k_bytes(stage) + kNvfp4SlotBytes + fp4f::kScaleOffset, warp, lane, row_scale,
                           valid_keys);
  }
};

}  // namespace msa::cuda::attention
