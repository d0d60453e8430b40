// One mma.m16n8k16 and one ldmatrix.x4 over a warp, emulated on the CPU with
// the PTX fragment layouts (g = lane / 4, t = lane % 4), for the tests that
// replay the row kernel's fragment arithmetic (test_fp8_fragments,
// test_fp4_fragments).
//   a[lane] = {a0..a7}, b[lane] = {b0 low, b0 high, b1 low, b1 high},
//   c[lane] = {c0..c3}: rows g (c0, c1) and g + 8 (c2, c3), columns 2t, 2t + 1
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace msa::test {

// ldmatrix.x4 (b16) from a byte plane: lane 8m + r gives, as row_offset(8m +
// r), the byte offset of row r of matrix m; lane l receives, for matrix m, the
// 32 bits at bytes 4 (l % 4) of row l / 4 (non-trans) or the 16-bit elements
// [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4] (trans), low half first.
// Returned as 4 bytes per (lane, matrix), byte 0 the lowest.
using LdmatrixRegs = std::array<std::array<std::array<std::uint8_t, 4>, 4>, 32>;  // [lane][matrix][byte]
template <class RowOffset>
LdmatrixRegs ldmatrix_x4(const std::vector<std::uint8_t>& plane, RowOffset row_offset, bool trans) {
  std::array<int, 32> offset{};
  for (int l = 0; l < 32; ++l) offset[std::size_t(l)] = row_offset(l);
  LdmatrixRegs out{};
  for (std::size_t l = 0; l < 32; ++l)
    for (std::size_t m = 0; m < 4; ++m) {
      auto row = [&](std::size_t r) { return plane.data() + offset[8 * m + r]; };
      if (!trans) {
        for (std::size_t b = 0; b < 4; ++b) out[l][m][b] = row(l / 4)[4 * (l % 4) + b];
      } else {
        const std::size_t c = l / 4, r0 = 2 * (l % 4);
        out[l][m] = {row(r0)[2 * c], row(r0)[2 * c + 1], row(r0 + 1)[2 * c], row(r0 + 1)[2 * c + 1]};
      }
    }
  return out;
}
// The 32-bit register of 4 bytes, byte 0 the lowest.
inline std::uint32_t reg_word(const std::array<std::uint8_t, 4>& b) {
  return std::uint32_t(b[0]) | (std::uint32_t(b[1]) << 8) | (std::uint32_t(b[2]) << 16) | (std::uint32_t(b[3]) << 24);
}

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

// Checks every accumulator of the n-tiles c[0 .. N): element e of lane l of
// n-tile t (row l / 4, + 8 for e >= 2; column 2 (l % 4) + (e & 1)) must equal
// want(t, row, column). Fatal on the first mismatch (ASSERT_NO_FATAL_FAILURE
// at the caller stops there); `what` leads the message.
template <class T, std::size_t N, class Want>
void expect_accumulators(const CFragment<T> (&c)[N], Want want, const std::string& what) {
  for (int l = 0; l < 32; ++l)
    for (std::size_t t = 0; t < N; ++t)
      for (int e = 0; e < 4; ++e) {
        const int row = l / 4 + (e >= 2 ? 8 : 0), column = 2 * (l % 4) + (e & 1);
        ASSERT_EQ(c[t][std::size_t(l)][std::size_t(e)], want(int(t), row, column))
            << what << " lane " << l << " n-tile " << t << " e " << e;
      }
}

}  // namespace msa::test
