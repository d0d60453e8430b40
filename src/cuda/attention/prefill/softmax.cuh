// The online softmax of the wgmma token-tile kernel, per block and thread
// (two rows of a warpgroup's 64 x 128 score fragment), in two parts so that
// the scores' part can run while the warpgroup's PV of the previous block is
// in flight: softmax_scores (mask, max, exponentials, sums), softmax_output
// (rescale O, pack P as wgmma A fragments).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/attention/params.cuh"
#include "cuda/common/ptx.cuh"

namespace msa::cuda::attention {

// A row's running max moves only when a block's max exceeds it by more than
// this (log2 units), so that most blocks skip the rescale of O; P stays
// <= 2^8, exact in the MMA type's exponent range, and l and the lse use the
// same max, so the result does not change.
inline constexpr float kRescaleSlack = 8.0f;

// How a block's softmax rescales the rows' output (softmax_scores).
struct Rescale {
  float alpha0 = 1.0f, alpha1 = 1.0f;  // factors of the thread's two rows
  bool any = false;                    // some row of the warp raised its max
};

// Online softmax of one block for the thread's two rows, first part (it
// touches neither O nor P, so it runs while the warpgroup's PV of the
// previous block is in flight): masks the scores of keys >= limit[i] (key
// index inside the block; kMasked false: every key is visible to both rows),
// moves the running max m (kRescaleSlack) and sum l, and leaves the
// exponentials in sc. softmax_output then rescales O and packs P.
// The scale is folded into the exponent (one FFMA per score), which needs
// scale > 0 (a masked -inf score then gives exactly 0); softmax_scores_any
// picks the variant.
//   sc: the 64 x 128 score fragment (rows lane/4 and lane/4 + 8 of the warp)
template <bool kMasked>
__device__ __forceinline__ Rescale softmax_scores(float (&sc)[64], float (&m)[2], float (&l)[2], int limit0,
                                                  int limit1, float scale, int col) {
  // Four partial maxima / sums per row: short dependency chains.
  float px0[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, px1[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if constexpr (kMasked) {
        const int key = 8 * j + col + e;
        sc[4 * j + e] = key < limit0 ? sc[4 * j + e] : -INFINITY;
        sc[4 * j + 2 + e] = key < limit1 ? sc[4 * j + 2 + e] : -INFINITY;
      }
      const int a = (2 * j + e) & 3;
      px0[a] = fmaxf(px0[a], sc[4 * j + e]);
      px1[a] = fmaxf(px1[a], sc[4 * j + 2 + e]);
    }
  }
  float mx0 = fmaxf(fmaxf(px0[0], px0[1]), fmaxf(px0[2], px0[3]));
  float mx1 = fmaxf(fmaxf(px1[0], px1[1]), fmaxf(px1[2], px1[3]));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  // A row raises its max when the block's exceeds it by more than the slack
  // (from -inf: whenever the block has a visible key).
  const bool raise0 = mx0 * scale > m[0] + kRescaleSlack, raise1 = mx1 * scale > m[1] + kRescaleSlack;
  const float new0 = raise0 ? mx0 * scale : m[0], new1 = raise1 ? mx1 * scale : m[1];
  const float use0 = new0 == -INFINITY ? 0.0f : new0, use1 = new1 == -INFINITY ? 0.0f : new1;
  Rescale r;
  r.alpha0 = raise0 ? fast_exp2(m[0] - use0) : 1.0f;
  r.alpha1 = raise1 ? fast_exp2(m[1] - use1) : 1.0f;
  r.any = __any_sync(0xffffffffu, raise0 || raise1);
  m[0] = new0;
  m[1] = new1;
  float ps0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ps1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int a = (2 * j + e) & 3;
      sc[4 * j + e] = fast_exp2(fmaf(sc[4 * j + e], scale, -use0));
      sc[4 * j + 2 + e] = fast_exp2(fmaf(sc[4 * j + 2 + e], scale, -use1));
      ps0[a] += sc[4 * j + e];
      ps1[a] += sc[4 * j + 2 + e];
    }
  }
  l[0] = l[0] * r.alpha0 + ((ps0[0] + ps0[1]) + (ps0[2] + ps0[3]));
  l[1] = l[1] * r.alpha1 + ((ps1[0] + ps1[1]) + (ps1[2] + ps1[3]));
  return r;
}

// Second part, once the warpgroup's PV of the previous block is done: O
// rescaled, P (the MMA type) as the A fragments of the 8 k-steps of 16 keys.
template <bool kF16>
__device__ __forceinline__ void softmax_output(const float (&sc)[64], float (&o)[64], std::uint32_t (&pa)[8][4],
                                               const Rescale& r) {
  if (r.any) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= r.alpha0;
      o[4 * j + 1] *= r.alpha0;
      o[4 * j + 2] *= r.alpha1;
      o[4 * j + 3] *= r.alpha1;
    }
  }
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = pack2<kF16>(sc[8 * kk], sc[8 * kk + 1]);
    pa[kk][1] = pack2<kF16>(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = pack2<kF16>(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = pack2<kF16>(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}

// softmax_scores for any scale (zero or negative included, where folding the
// scale into the exponent would not mask): scores are scaled before the mask
// and the max; otherwise the variant that masks only when a limit cuts the block.
__device__ __forceinline__ Rescale softmax_scores_any(float (&sc)[64], float (&m)[2], float (&l)[2], int limit0,
                                                      int limit1, float scale, int col) {
  if (!(scale > 0.0f)) {
#pragma unroll
    for (int j = 0; j < 64; ++j) sc[j] *= scale;
    return softmax_scores<true>(sc, m, l, limit0, limit1, 1.0f, col);
  }
  if (limit0 >= kBlockKeys && limit1 >= kBlockKeys) return softmax_scores<false>(sc, m, l, limit0, limit1, scale, col);
  return softmax_scores<true>(sc, m, l, limit0, limit1, scale, col);
}

}  // namespace msa::cuda::attention
