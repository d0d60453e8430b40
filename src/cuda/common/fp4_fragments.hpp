// Where the row kernel's nvfp4 path finds its MMA fragments when it reads the
// raw e2m1 codes with ldmatrix and converts them in registers, instead of
// widening the block to a 16-bit tile first. Index arithmetic and the code
// conversion, host and device, so that a CPU test
// (tests/unit/test_fp4_fragments.cpp) can replay the PTX fragment layouts and
// check that the products come out exact.
//
// Raw stage: one slot (K or V) of one block as in the cache (MSA_CONTRACT 4.3),
// [128 keys][64 data bytes] then [128 keys][8 e4m3 group scales]; the data
// byte i of a key holds dims 2i (low nibble) and 2i + 1. In shared memory the
// 16-byte chunk c (dims 32c .. 32c + 31) of key r sits at chunk
// c ^ ((r >> 1) & 3) of its row, so that the 8 rows of an ldmatrix hit 8
// different bank groups. The scales are not swizzled.
//
// The layouts below are those of bf16 MMA; fp16 MMA (the row kernel's type)
// pairs the codes differently, as e2m1x8_to_f16_high_bytes says.
//
// QK^T (mma m16n8k16, B = K^T): an ldmatrix of 8 keys x 16 bytes (one chunk)
// hands lane l the 8 codes of dims 32c + 8q .. 32c + 8q + 7 (q = l % 4) of key
// l / 4. Converted (e2m1x8_to_pairs) they are four pairs: (e0, e1) and
// (e2, e3) are b0 and b1 of k-step 2c, (e4, e5) and (e6, e7) those of k-step
// 2c + 1; all eight share the scale of group 2c + q / 2. So k-position 2q + e
// of k-step 2c + h is dim 32c + 8q + 4h + e and position 8 + 2q + e is dim
// 32c + 8q + 4h + 2 + e: the query tile is staged with its dims permuted the
// same way (q_source_word) and the dot products are unchanged.
//
// PV (B = V): an ldmatrix.trans of 8 keys x 16 bytes hands lane l, as two
// 16-bit halves, the codes of dims 32c + 4n .. 32c + 4n + 3 (n = l / 4) of
// key 2q and of key 2q + 1. Converted, the pairs (key 2q, key 2q + 1) of dim
// 32c + 4n + e (kPairSelector) are b0 of n-tile 4c + e, column n; the keys
// 8 + 2q, 9 + 2q give b1 from the next matrix. The scales of a pair are the
// two keys' scales of group 2c + n / 4. Output n-tile t therefore holds dims
// out_dim(t, q, f).
#pragma once

#include <cstdint>

#include "msa/common.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace msa::cuda::fp4f {

// Byte offset of chunk `chunk` (32 codes) of key `key` in a raw data plane.
MSA_HD int raw_offset(int key, int chunk) { return key * 64 + ((chunk ^ ((key >> 1) & 3)) << 4); }
inline constexpr int kScaleOffset = 128 * 64;  // [128 keys][8] e4m3 group scales after the data

// The query tile's 16-bit word m (positions 2m, 2m + 1) of k-step 2c + h holds
// the original word q_source_word(h, m) (dims 2w, 2w + 1) of the 32-dim chunk c.
MSA_HD int q_source_word(int h, int m) { return 4 * (m & 3) + 2 * h + (m >> 2); }

// The row that lane `lane` points ldmatrix.x4 at for the K fragments of n-tile
// nt (keys key_base + 8 nt ..): matrix m is chunk m (k-steps 2m, 2m + 1).
MSA_HD void k_source(int lane, int key_base, int nt, int& key, int& chunk) {
  key = key_base + 8 * nt + (lane & 7);
  chunk = lane >> 3;
}

// The row that lane `lane` points ldmatrix.x4.trans at for the V fragments of
// k-step kk (keys key_base + 16 kk ..) and chunks (2 cp, 2 cp + 1): matrices
// (keys 0-7, chunk 2cp), (keys 8-15, 2cp), (keys 0-7, 2cp + 1),
// (keys 8-15, 2cp + 1), in that register order.
MSA_HD void v_source(int lane, int key_base, int kk, int cp, int& key, int& chunk) {
  const int m = lane >> 3;
  key = key_base + 16 * kk + ((m & 1) ? 8 : 0) + (lane & 7);
  chunk = 2 * cp + (m >> 1);
}

// Dim of accumulator column 2q + f of output n-tile t.
MSA_HD int out_dim(int t, int q, int f) { return 32 * (t >> 2) + 8 * q + 4 * f + (t & 3); }

// prmt: result byte i is byte (sel >> 4 i) & 7 of the pair (a = bytes 0-3,
// b = bytes 4-7). Selector nibbles here never set bit 3.
MSA_HD std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, sel);
#else
  const std::uint64_t x = a | (std::uint64_t(b) << 32);
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= std::uint32_t((x >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}

// prmt(a, b, kPairLow): the low halves of a and b as one word (kPairHigh: the
// high halves). PV: the b0 of n-tiles 4c + e from the converted halves of one
// ldmatrix.trans register: pairs[0] = (key 2q: dims e0, e1), pairs[1] = (key
// 2q: e2, e3), pairs[2], pairs[3] the same for key 2q + 1. e = 0:
// prmt(pairs[0], pairs[2], kPairLow); e = 1: kPairHigh; e = 2, 3 the same on
// pairs[1], pairs[3].
inline constexpr std::uint32_t kPairLow = 0x5410u;
inline constexpr std::uint32_t kPairHigh = 0x7632u;

// Eight e2m1 codes (nibble j = element j, sign in bit 3) -> four pairs of the
// MMA type (bf16, or fp16 when kF16), exact: out[i] = (element 2i, element 2i + 1),
// low half first. The magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} come from byte
// tables by prmt (high and low byte of each value), the sign bits are moved
// to bit 7 of the high bytes.
template <bool kF16>
MSA_HD void e2m1x8_to_pairs(std::uint32_t w, std::uint32_t (&out)[4]) {
  // High bytes of the magnitudes, codes 0-3 and 4-7 (little-endian).
  constexpr std::uint32_t kHigh0 = kF16 ? 0x3E3C3800u : 0x3F3F3F00u;
  constexpr std::uint32_t kHigh1 = kF16 ? 0x46444240u : 0x40404040u;
  // bf16 low bytes (fp16's are all zero).
  constexpr std::uint32_t kLow0 = 0xC0800000u, kLow1 = 0xC0804000u;
  for (int h = 0; h < 2; ++h) {
    const std::uint32_t ws = w >> (16 * h);  // elements 4h .. 4h + 3 in the low 16 bits
    const std::uint32_t sel = ws & 0x7777u;
    // Sign of element 4h + j (bit 4j + 3 of ws) to bit 8j + 7: j even from ws << 4, j odd from ws.
    const std::uint32_t sign = prmt(ws << 4, ws, 0x5140u) & 0x80808080u;
    const std::uint32_t high = prmt(kHigh0, kHigh1, sel) | sign;
    if constexpr (kF16) {
      out[2 * h] = prmt(high, 0u, 0x1404u);
      out[2 * h + 1] = prmt(high, 0u, 0x3424u);
    } else {
      const std::uint32_t low = prmt(kLow0, kLow1, sel);
      out[2 * h] = prmt(low, high, 0x5140u);
      out[2 * h + 1] = prmt(low, high, 0x7362u);
    }
  }
}

// fp16 MMA (the row kernel's type over nvfp4): a code s e1 e0 m placed at
// fp16 bits 15 and 11..9 (exponent e1 e0, mantissa m) is its e2m1 value times
// 2^-14, the subnormal e = 0 codes included, and the fp16's low byte is zero.
// So eight codes become the high bytes "s 0 0 0 e1 e0 m 0" of their fp16
// values in four logic instructions, and each pair of the MMA type one prmt
// with zero (kHigh*) away. The kernel multiplies the values by their group
// scales times 2^7 (exact: at most 6 * 448 * 2^-7, at least 2^-17, six
// significant bits) and undoes the remaining 2^-7 in fp32 (QK^T) or in the
// probabilities (PV).
//   even: bytes 0-3 = elements 0, 2, 4, 6;  odd: elements 1, 3, 5, 7
MSA_HD void e2m1x8_to_f16_high_bytes(std::uint32_t w, std::uint32_t& even, std::uint32_t& odd) {
  even = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0E0E0E0Eu);
  odd = (w & 0x80808080u) | ((w >> 3) & 0x0E0E0E0Eu);
}
// prmt(bytes, 0, kHighAB): the fp16 pair (byte A, byte B) of e2m1x8_to_f16_high_bytes.
inline constexpr std::uint32_t kHigh01 = 0x1404u, kHigh23 = 0x3424u, kHigh02 = 0x2404u, kHigh13 = 0x3414u;

// QK^T on fp16 MMA (B = K^T, the ldmatrix of k_source): k-step 2c + h takes
// b0 = elements (h, h + 2) and b1 = (4 + h, 6 + h) of a lane's 8 codes
// (prmt kHigh01 and kHigh23 of the even bytes for h = 0, of the odd ones for
// h = 1). So k-positions 2q + j and 8 + 2q + j are dims 32c + 8q + h + 2j and
// 32c + 8q + 4 + h + 2j, and the query tile's word m of k-step 2c + h is the
// halves h of the chunk's words q_source_pair(m) and q_source_pair(m) + 1
// (word w: dims 2w, 2w + 1; kPairLow / kPairHigh take them).
MSA_HD int q_source_pair(int m) { return 4 * (m & 3) + 2 * (m >> 2); }

// PV on fp16 MMA: of a converted ldmatrix.trans register (key 2q: elements
// 0-3, key 2q + 1: 4-7, dims 32c + 4n + e), the b0 of n-tile 4c + e is
// (even, odd, even, odd)[e] through (kHigh02, kHigh02, kHigh13, kHigh13)[e].

// Of a key's 8 group-scale bytes (lo = groups 0-3, hi = groups 4-7), byte c of
// the result is group 2c + odd (odd = 0 or 1).
MSA_HD std::uint32_t scale_bytes(std::uint32_t lo, std::uint32_t hi, int odd) {
  return prmt(lo, hi, odd ? 0x7531u : 0x6420u);
}

}  // namespace msa::cuda::fp4f
