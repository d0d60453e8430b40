// x86 max-dot kernels (AVX-512 and AVX2+FMA), chosen at run time by
// max_dots_kernel(). A tile of R query rows against W keys keeps its R x W
// partial dots in registers for the whole d loop: per d it loads W keys of row
// d of the transposed block, broadcasts the R query values and issues R * W /
// lanes FMAs. Every dot is the same in-order FMA chain as the portable kernel
// (see indexer_dots.hpp), so all kernels give bit-identical scores.
#include "cpu/indexer_dots.hpp"

#if defined(MSA_INDEXER_X86)

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace msa::cpu::indexer {

namespace {

#define MSA_AVX512 __attribute__((target("avx512f")))
#define MSA_AVX2 __attribute__((target("avx2,fma")))

// Lanes [first, first + lanes) of a row with `visible` visible keys: how many
// of them are visible, in [0, lanes].
inline int visible_lanes(const std::int32_t* visible, std::int64_t r, int first, int lanes) {
  if (!visible) return lanes;
  const int n = visible[r] - first;
  return n <= 0 ? 0 : (n >= lanes ? lanes : n);
}

// ---- AVX-512: tiles of R rows x 32 keys (2 zmm per row) ------------------------

// best = NaN-lowest max(best, x), lane-wise, with lanes >= n of x excluded.
MSA_AVX512 inline void fold512(float* best, __m512 x, int n) {
  const __mmask16 keep = n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
  const __m512 nan = _mm512_set1_ps(NAN);
  x = _mm512_mask_mov_ps(nan, keep, x);
  __m512 b = _mm512_load_ps(best);
  const __mmask16 take = _mm512_cmp_ps_mask(x, b, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
  b = _mm512_mask_mov_ps(b, take, x);
  _mm512_store_ps(best, b);
}

template <int R>
MSA_AVX512 void tile512(const float* q, const KeyBlock& keys, const std::int32_t* visible, float* out,
                        std::int64_t out_stride) {
  alignas(64) float best[R][16];
  for (int r = 0; r < R; ++r) _mm512_store_ps(best[r], _mm512_set1_ps(NAN));
  for (int j0 = 0; j0 < kBlockSize; j0 += 32) {
    __m512 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
    const float* k = keys.v + j0;
    for (int d = 0; d < kHeadDim; ++d) {
      const __m512 k0 = _mm512_load_ps(k + d * kBlockSize);
      const __m512 k1 = _mm512_load_ps(k + d * kBlockSize + 16);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 qb = _mm512_set1_ps(q[r * kHeadDim + d]);
        acc0[r] = _mm512_fmadd_ps(qb, k0, acc0[r]);
        acc1[r] = _mm512_fmadd_ps(qb, k1, acc1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      fold512(best[r], acc0[r], visible_lanes(visible, r, j0, 16));
      fold512(best[r], acc1[r], visible_lanes(visible, r, j0 + 16, 16));
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = NAN;
    for (int l = 0; l < 16; ++l) s = max_nan_lowest(s, best[r][l]);
    out[r * out_stride] = s;
  }
}

// ---- AVX2: tiles of R rows x 16 keys (2 ymm per row) ----------------------------

MSA_AVX2 inline void fold256(float* best, __m256 x, int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
  x = _mm256_blendv_ps(_mm256_set1_ps(NAN), x, keep);
  __m256 b = _mm256_load_ps(best);
  const __m256 take = _mm256_or_ps(_mm256_cmp_ps(x, b, _CMP_GT_OQ), _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  b = _mm256_blendv_ps(b, x, take);
  _mm256_store_ps(best, b);
}

template <int R>
MSA_AVX2 void tile256(const float* q, const KeyBlock& keys, const std::int32_t* visible, float* out,
                      std::int64_t out_stride) {
  alignas(32) float best[R][8];
  for (int r = 0; r < R; ++r) _mm256_store_ps(best[r], _mm256_set1_ps(NAN));
  for (int j0 = 0; j0 < kBlockSize; j0 += 16) {
    __m256 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
    const float* k = keys.v + j0;
    for (int d = 0; d < kHeadDim; ++d) {
      const __m256 k0 = _mm256_load_ps(k + d * kBlockSize);
      const __m256 k1 = _mm256_load_ps(k + d * kBlockSize + 8);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256 qb = _mm256_broadcast_ss(q + r * kHeadDim + d);
        acc0[r] = _mm256_fmadd_ps(qb, k0, acc0[r]);
        acc1[r] = _mm256_fmadd_ps(qb, k1, acc1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      fold256(best[r], acc0[r], visible_lanes(visible, r, j0, 8));
      fold256(best[r], acc1[r], visible_lanes(visible, r, j0 + 8, 8));
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = NAN;
    for (int l = 0; l < 8; ++l) s = max_nan_lowest(s, best[r][l]);
    out[r * out_stride] = s;
  }
}

// Runs `tile<R>` over rows [r, r + R) while they last, for R = Big, then 4, 2, 1.
template <typename Big, typename Four, typename Two, typename One>
void cover_rows(std::int64_t num_rows, int big, Big tile_big, Four tile4, Two tile2, One tile1) {
  std::int64_t r = 0;
  for (; r + big <= num_rows; r += big) tile_big(r);
  for (; r + 4 <= num_rows; r += 4) tile4(r);
  for (; r + 2 <= num_rows; r += 2) tile2(r);
  for (; r < num_rows; ++r) tile1(r);
}

}  // namespace

void max_dots_avx512(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                     const std::int32_t* visible, float* out, std::int64_t out_stride) {
  auto at = [&](auto tile) {
    return [&, tile](std::int64_t r) {
      tile(q + r * kHeadDim, keys, visible ? visible + r : nullptr, out + r * out_stride, out_stride);
    };
  };
  cover_rows(num_rows, 12, at(&tile512<12>), at(&tile512<4>), at(&tile512<2>), at(&tile512<1>));
}

void max_dots_avx2(const float* q, std::int64_t num_rows, const KeyBlock& keys,
                   const std::int32_t* visible, float* out, std::int64_t out_stride) {
  auto at = [&](auto tile) {
    return [&, tile](std::int64_t r) {
      tile(q + r * kHeadDim, keys, visible ? visible + r : nullptr, out + r * out_stride, out_stride);
    };
  };
  cover_rows(num_rows, 6, at(&tile256<6>), at(&tile256<4>), at(&tile256<2>), at(&tile256<1>));
}

}  // namespace msa::cpu::indexer

#endif  // MSA_INDEXER_X86
