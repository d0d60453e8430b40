// The fp8 row kernel's fragment arithmetic (src/cuda/attention/fp8_fragments.hpp)
// replayed on the CPU with the PTX layouts of ldmatrix (.x4, .trans) and
// mma.m16n8k16: with integer data the warp's QK^T and PV must equal the plain
// products exactly, for every key, query row and dim.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/fp8_fragments.hpp"
#include "warp_mma_emulation.hpp"

namespace {

namespace f = msa::cuda::fp8f;

constexpr int kKeys = 128, kDim = 128, kRows = 16;

// A raw plane with the swizzle: code of (key, dim) at raw_offset(key, dim / 16) + dim % 16.
std::vector<std::uint8_t> make_plane(const std::vector<int>& codes) {
  std::vector<std::uint8_t> plane(kKeys * kDim);
  for (int k = 0; k < kKeys; ++k)
    for (int d = 0; d < kDim; ++d) plane[std::size_t(f::raw_offset(k, d / 16) + d % 16)] = std::uint8_t(codes[std::size_t(k * kDim + d)]);
  return plane;
}

int decode(std::uint8_t code) { return int(code) - 8; }  // a stand-in for the fp8 conversion

using Regs = msa::test::LdmatrixRegs;

// prmt(x, sel): result byte i is x's byte (sel >> 4 i) & 7 (only bytes 0-3 used here).
std::array<std::uint8_t, 4> prmt(const std::array<std::uint8_t, 4>& x, unsigned sel) {
  std::array<std::uint8_t, 4> r{};
  for (int i = 0; i < 4; ++i) r[std::size_t(i)] = x[(sel >> (4 * i)) & 3u];
  return r;
}

using AFrag = msa::test::AFragment<long>;
using BFrag = msa::test::BFragment<long>;
using CFrag = msa::test::CFragment<long>;
void mma(CFrag& c, const AFrag& a, const BFrag& b) { msa::test::warp_mma(c, a, b); }

TEST(Fp8Fragments, QueryPermutationIsAPermutation) {
  std::array<int, 8> seen{};
  for (int m = 0; m < 8; ++m) ++seen[std::size_t(f::q_source_word(m))];
  for (int w : seen) EXPECT_EQ(w, 1);
  // Output dims: every (chunk, lane quad position, element) once.
  std::vector<int> dims(kDim, 0);
  for (int t = 0; t < 16; ++t)
    for (int q = 0; q < 4; ++q)
      for (int e = 0; e < 2; ++e) ++dims[std::size_t(f::out_dim(t, q, e))];
  for (int d : dims) EXPECT_EQ(d, 1);
}

TEST(Fp8Fragments, WarpProductsAreExact) {
  std::mt19937 rng(20261129);
  std::uniform_int_distribution<int> code(0, 15), small(-3, 3), prob(0, 3);
  std::vector<int> kc(kKeys * kDim), vc(kKeys * kDim), q(kRows * kDim), p(kRows * kKeys);
  for (int& x : kc) x = code(rng);
  for (int& x : vc) x = code(rng);
  for (int& x : q) x = small(rng);
  for (int& x : p) x = prob(rng);
  const auto kplane = make_plane(kc), vplane = make_plane(vc);
  // The query tile as staged: word m of each 16-dim group from word q_source_word(m).
  std::vector<int> qp(kRows * kDim);
  for (int r = 0; r < kRows; ++r)
    for (int g = 0; g < 8; ++g)
      for (int m = 0; m < 8; ++m)
        for (int e = 0; e < 2; ++e)
          qp[std::size_t(r * kDim + 16 * g + 2 * m + e)] = q[std::size_t(r * kDim + 16 * g + 2 * f::q_source_word(m) + e)];

  for (int warp = 0; warp < 4; ++warp) {
    const int key_base = 32 * warp;
    // ---- S = Q K^T: 4 n-tiles of 8 keys, 8 k-steps.
    CFrag s[4] = {};
    for (int jp = 0; jp < 4; ++jp)
      for (int np = 0; np < 2; ++np) {
        const Regs r = msa::test::ldmatrix_x4(kplane, [&](int l) {
          int key = 0, chunk = 0;
          f::k_source(l, key_base, np, jp, key, chunk);
          return f::raw_offset(key, chunk);
        }, false);
        for (int m = 0; m < 4; ++m) {
          const int nt = 2 * np + (m >> 1), ks = 2 * jp + (m & 1);
          const AFrag a =
              msa::test::a_fragment<long>([&](int row, int d) { return long(qp[std::size_t(row * kDim + d)]); }, 16 * ks);
          BFrag b{};
          for (int l = 0; l < 32; ++l)
            for (int e = 0; e < 4; ++e) b[l][e] = decode(r[l][m][e]);  // b0 = bytes 0,1; b1 = bytes 2,3
          mma(s[nt], a, b);
        }
      }
    ASSERT_NO_FATAL_FAILURE(msa::test::expect_accumulators(s, [&](int nt, int row, int column) {
      const int key = key_base + 8 * nt + column;
      long want = 0;
      for (int d = 0; d < kDim; ++d) want += long(q[std::size_t(row * kDim + d)]) * decode(std::uint8_t(kc[std::size_t(key * kDim + d)]));
      return want;
    }, "S, warp " + std::to_string(warp)));

    // ---- O = P V: the probabilities in the score accumulators' layout, 2 k-steps, 16 n-tiles.
    CFrag o[16] = {};
    for (int kk = 0; kk < 2; ++kk) {
      const AFrag a = msa::test::a_fragment<long>(
          [&](int row, int key) { return long(p[std::size_t(row * kKeys + key)]); }, key_base + 16 * kk);
      for (int jp = 0; jp < 4; ++jp) {
        const Regs r = msa::test::ldmatrix_x4(vplane, [&](int l) {
          int key = 0, chunk = 0;
          f::v_source(l, key_base, kk, jp, key, chunk);
          return f::raw_offset(key, chunk);
        }, true);
        for (int c = 0; c < 2; ++c) {
          const int j = 2 * jp + c;
          BFrag even{}, odd{};
          for (int l = 0; l < 32; ++l) {
            const auto lo = prmt(r[l][2 * c], f::kPairBytes), hi = prmt(r[l][2 * c + 1], f::kPairBytes);
            even[l] = {decode(lo[0]), decode(lo[1]), decode(hi[0]), decode(hi[1])};
            odd[l] = {decode(lo[2]), decode(lo[3]), decode(hi[2]), decode(hi[3])};
          }
          mma(o[2 * j], a, even);
          mma(o[2 * j + 1], a, odd);
        }
      }
    }
    ASSERT_NO_FATAL_FAILURE(msa::test::expect_accumulators(o, [&](int t, int row, int column) {
      const int dim = f::out_dim(t, column / 2, column & 1);
      long want = 0;
      for (int k = key_base; k < key_base + 32; ++k)
        want += long(p[std::size_t(row * kKeys + k)]) * decode(std::uint8_t(vc[std::size_t(k * kDim + dim)]));
      return want;
    }, "O, warp " + std::to_string(warp)));
  }
}

TEST(Fp8Fragments, LdmatrixRowsAreBankConflictFree) {
  // The 8 row addresses of each matrix fall in 8 different 16-byte bank groups.
  for (int jp = 0; jp < 4; ++jp)
    for (int np = 0; np < 2; ++np)
      for (int m = 0; m < 4; ++m) {
        std::array<int, 8> k_groups{}, v_groups{};
        for (int r = 0; r < 8; ++r) {
          int key = 0, chunk = 0;
          f::k_source(8 * m + r, 32, np, jp, key, chunk);
          ++k_groups[std::size_t((f::raw_offset(key, chunk) / 16) % 8)];
          f::v_source(8 * m + r, 32, np, jp, key, chunk);  // np plays kk
          ++v_groups[std::size_t((f::raw_offset(key, chunk) / 16) % 8)];
        }
        for (int n : k_groups) EXPECT_EQ(n, 1);
        for (int n : v_groups) EXPECT_EQ(n, 1);
      }
}

}  // namespace
