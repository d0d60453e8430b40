// One mma.m16n8k16 over a warp, emulated on the CPU with the PTX fragment
// layouts (g = lane / 4, t = lane % 4), for the tests that replay the row
// kernel's fragment arithmetic (test_fp8_fragments, test_fp4_fragments).
//   a[lane] = {a0..a7}, b[lane] = {b0 low, b0 high, b1 low, b1 high},
//   c[lane] = {c0..c3}: rows g (c0, c1) and g + 8 (c2, c3), columns 2t, 2t + 1
#pragma once

#include <array>
#include <cstddef>

namespace msa::test {

template <class T>
using AFragment = std::array<std::array<T, 8>, 32>;
template <class T>
using BFragment = std::array<std::array<T, 4>, 32>;
template <class T>
using CFragment = std::array<std::array<T, 4>, 32>;

// The A fragment of the 16 x 16 matrix at(row, k0 + k) (rows 0-15, k 0-15).
template <class T, class At>
AFragment<T> a_fragment(At at, int k0) {
  AFragment<T> a{};
  for (std::size_t l = 0; l < 32; ++l) {
    const int g = int(l / 4), t = int(l % 4);
    for (int e = 0; e < 2; ++e) {
      a[l][std::size_t(e)] = at(g, k0 + 2 * t + e);
      a[l][std::size_t(2 + e)] = at(g + 8, k0 + 2 * t + e);
      a[l][std::size_t(4 + e)] = at(g, k0 + 8 + 2 * t + e);
      a[l][std::size_t(6 + e)] = at(g + 8, k0 + 8 + 2 * t + e);
    }
  }
  return a;
}

template <class T>
void warp_mma(CFragment<T>& c, const AFragment<T>& a, const BFragment<T>& b) {
  T A[16][16] = {}, B[16][8] = {};
  for (std::size_t l = 0; l < 32; ++l) {
    const std::size_t g = l / 4, t = l % 4;
    for (std::size_t e = 0; e < 2; ++e) {
      A[g][2 * t + e] = a[l][e];
      A[g + 8][2 * t + e] = a[l][2 + e];
      A[g][2 * t + 8 + e] = a[l][4 + e];
      A[g + 8][2 * t + 8 + e] = a[l][6 + e];
      B[2 * t + e][g] = b[l][e];
      B[2 * t + 8 + e][g] = b[l][2 + e];
    }
  }
  for (std::size_t l = 0; l < 32; ++l) {
    const std::size_t g = l / 4, t = l % 4;
    for (std::size_t e = 0; e < 4; ++e) {
      const std::size_t row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
      for (std::size_t k = 0; k < 16; ++k) c[l][e] += A[row][k] * B[k][col];
    }
  }
}

}  // namespace msa::test
