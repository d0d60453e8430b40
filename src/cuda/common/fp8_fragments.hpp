// Where the row kernel's fp8 path finds its MMA fragments when it reads the
// raw fp8 codes with ldmatrix and converts them in registers, instead of
// widening the block to a 16-bit tile first. Pure index arithmetic, host and
// device, so that a CPU test (tests/unit/test_fp8_fragments.cpp) can replay
// the PTX fragment layouts and check that the products come out exact.
//
// Raw stage: K and V of one block as [128 keys][128 codes], one byte per
// dim; the 16-byte chunk c (dims 16c .. 16c + 15) of key r sits at chunk
// c ^ (r & 7) of its row, so that the 8 rows of an ldmatrix hit 8 different
// bank groups.
//
// QK^T (mma m16n8k16, B = K^T): an ldmatrix of 8 keys x 16 codes hands lane l
// the 4 codes 4q .. 4q + 3 (q = l % 4) of key l / 4; converted they are the
// lane's b0 (codes 4q, 4q + 1) and b1 (4q + 2, 4q + 3). So k-position 2q + e
// of a k-step is dim 4q + e of its chunk and position 8 + 2q + e is dim
// 4q + 2 + e: the query tile is staged with its dims permuted the same way
// (q_source_word) and the dot products are unchanged.
//
// PV (B = V): an ldmatrix.trans of 8 keys x 16 codes hands lane l, as two
// 16-bit halves, codes (2c, 2c + 1) of key 2q and the same codes of key 2q + 1
// (c = l / 4). A byte permute (kPairBytes) makes (key 2q, key 2q + 1) pairs of
// code 2c and of code 2c + 1: the b0 of two n-tiles, "even" (column n = dim
// 2n of the chunk) and "odd" (dim 2n + 1). The output n-tile t = 2 c + parity
// therefore holds dims out_dim(t, q, e): for each chunk a lane's four
// accumulators (even e 0, odd e 0, even e 1, odd e 1) are four consecutive
// dims.
#pragma once

#include "msa/common.hpp"

namespace msa::cuda::fp8f {

// Byte offset of chunk `chunk` (16 codes) of key `key` in a raw K or V plane.
MSA_HD int raw_offset(int key, int chunk) { return key * 128 + ((chunk ^ (key & 7)) << 4); }

// The query tile's 16-bit word m (positions 2m, 2m + 1) of a 16-dim group
// holds the original word q_source_word(m) (dims 2w, 2w + 1).
MSA_HD int q_source_word(int m) { return m < 4 ? 2 * m : 2 * (m - 4) + 1; }

// The row that lane `lane` points ldmatrix.x4 at for the K fragments of
// n-tiles (2 np, 2 np + 1) and k-steps (2 jp, 2 jp + 1) of the keys from
// key_base: matrices (n-tile 2np, k 2jp), (2np, 2jp + 1), (2np + 1, 2jp),
// (2np + 1, 2jp + 1), in that register order.
MSA_HD void k_source(int lane, int key_base, int np, int jp, int& key, int& chunk) {
  const int m = lane >> 3;
  key = key_base + 16 * np + ((m >> 1) ? 8 : 0) + (lane & 7);
  chunk = 2 * jp + (m & 1);
}

// The row that lane `lane` points ldmatrix.x4.trans at for the V fragments of
// k-step kk (keys key_base + 16 kk ..) and chunks (2 jp, 2 jp + 1): matrices
// (keys 0-7, chunk 2jp), (keys 8-15, 2jp), (keys 0-7, 2jp + 1),
// (keys 8-15, 2jp + 1), in that register order.
MSA_HD void v_source(int lane, int key_base, int kk, int jp, int& key, int& chunk) {
  const int m = lane >> 3;
  key = key_base + 16 * kk + ((m & 1) ? 8 : 0) + (lane & 7);
  chunk = 2 * jp + (m >> 1);
}

// prmt selector: bytes (0, 2, 1, 3): the low half pairs byte 0 and 2 (code 2c
// of keys 2q, 2q + 1), the high half byte 1 and 3 (code 2c + 1).
inline constexpr unsigned kPairBytes = 0x3120u;

// Dim of accumulator column 2q + e of output n-tile t.
MSA_HD int out_dim(int t, int q, int e) { return 16 * (t >> 1) + 4 * q + 2 * e + (t & 1); }

}  // namespace msa::cuda::fp8f
