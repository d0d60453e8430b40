// Tensor-core and conversion helpers of the indexer (inline PTX, sm_90a).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace msa::cuda::indexer {

// d += a * b on a 16x8x16 tile: bf16 inputs, fp32 accumulate.
//   a: 4 regs of bf16x2 (row-major 16x16), b: 2 regs of bf16x2 (col-major 16x8)
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                               std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += a * b on a 16x8x16 tile: fp16 inputs, fp32 accumulate (fragments as
// for bf16).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], std::uint32_t a0, std::uint32_t a1,
                                              std::uint32_t a2, std::uint32_t a3, std::uint32_t b0,
                                              std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two fp8 e4m3 values (low byte = first) to fp16x2 (low half = first), in one
// instruction. Exact: every e4m3 value is an fp16 value.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint32_t pair) {
  std::uint32_t out;
  asm("{\n"
      ".reg .b16 in;\n"
      "cvt.u16.u32 in, %1;\n"
      "cvt.rn.f16x2.e4m3x2 %0, in;\n"
      "}\n"
      : "=r"(out)
      : "r"(pair));
  return out;
}

// Two fp8 e4m3 values (low byte = first) to bf16x2 (low half = first). Exact:
// every e4m3 value, subnormals and NaN included, is a bf16 value.
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2(std::uint32_t pair) {
  std::uint32_t out;
  asm("{\n"
      ".reg .b32 h2;\n"
      ".reg .b16 lo, hi, in;\n"
      ".reg .f32 flo, fhi;\n"
      "cvt.u16.u32 in, %1;\n"
      "cvt.rn.f16x2.e4m3x2 h2, in;\n"
      "mov.b32 {lo, hi}, h2;\n"
      "cvt.f32.f16 flo, lo;\n"
      "cvt.f32.f16 fhi, hi;\n"
      "cvt.rn.bf16x2.f32 %0, fhi, flo;\n"
      "}\n"
      : "=r"(out)
      : "r"(pair));
  return out;
}

// Splits an fp16x2 pair into bf16x2 hi and lo with hi + lo exactly the fp16
// values (11 significant bits fit in two bf16 of 8).
__device__ __forceinline__ void fp16x2_to_bf16x2_split(std::uint32_t pair, std::uint32_t& hi,
                                                       std::uint32_t& lo) {
  asm("{\n"
      ".reg .b16 l16, h16;\n"
      ".reg .f32 fl, fh, hl, hh, rl, rh;\n"
      ".reg .b32 hib;\n"
      ".reg .b16 hib_l, hib_h;\n"
      "mov.b32 {l16, h16}, %2;\n"
      "cvt.f32.f16 fl, l16;\n"
      "cvt.f32.f16 fh, h16;\n"
      "cvt.rn.bf16x2.f32 hib, fh, fl;\n"
      "mov.b32 {hib_l, hib_h}, hib;\n"
      "cvt.f32.bf16 hl, hib_l;\n"
      "cvt.f32.bf16 hh, hib_h;\n"
      "sub.f32 rl, fl, hl;\n"
      "sub.f32 rh, fh, hh;\n"
      "cvt.rn.bf16x2.f32 %1, rh, rl;\n"
      "mov.b32 %0, hib;\n"
      "}\n"
      : "=r"(hi), "=r"(lo)
      : "r"(pair));
}

__device__ __forceinline__ std::uint32_t byte_perm(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  std::uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Eight e2m1 codes (element 2i in the low nibble of byte i, sign in bit 3 of
// its nibble) to four bf16x2 pairs (pair i = elements 2i, 2i + 1), exact. The
// magnitudes come from two 8-entry byte tables through prmt (the high and the
// low byte of each bf16), the signs are moved to bits 15 and 31.
__device__ __forceinline__ void e2m1x8_to_bf16x2(std::uint32_t w, std::uint32_t (&out)[4]) {
  // |code| 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6: bf16 high bytes 00 3F 3F 3F 40 40
  // 40 40, low bytes 00 00 80 C0 00 40 80 C0.
  constexpr std::uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;
  constexpr std::uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  const std::uint32_t idx = w & 0x77777777u;
  const std::uint32_t hi_a = byte_perm(kHi0, kHi1, idx);
  const std::uint32_t lo_a = byte_perm(kLo0, kLo1, idx);
  const std::uint32_t hi_b = byte_perm(kHi0, kHi1, idx >> 16);
  const std::uint32_t lo_b = byte_perm(kLo0, kLo1, idx >> 16);
  out[0] = byte_perm(lo_a, hi_a, 0x5140u) | ((w << 12) & 0x8000u) | ((w << 24) & 0x80000000u);
  out[1] = byte_perm(lo_a, hi_a, 0x7362u) | ((w << 4) & 0x8000u) | ((w << 16) & 0x80000000u);
  out[2] = byte_perm(lo_b, hi_b, 0x5140u) | ((w >> 4) & 0x8000u) | ((w << 8) & 0x80000000u);
  out[3] = byte_perm(lo_b, hi_b, 0x7362u) | ((w >> 12) & 0x8000u) | (w & 0x80000000u);
}

// Elementwise bf16x2 product (exact for an e2m1 value times an e4m3 scale).
__device__ __forceinline__ std::uint32_t bf16x2_mul(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// An e4m3 scale code as a bf16x2 pair of itself (exact).
__device__ __forceinline__ std::uint32_t e4m3_to_bf16x2_splat(std::uint32_t code) {
  const std::uint32_t v = e4m3x2_to_bf16x2(code & 0xFFu) & 0xFFFFu;
  return v | (v << 16);
}

// Elementwise fp16x2 product (subnormal inputs and results kept).
__device__ __forceinline__ std::uint32_t f16x2_mul(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Eight e2m1 codes w (element j: nibble j, element 2i in the low nibble of
// byte i) to four fp16x2 pairs of the values times 2^-14, exactly, in eleven
// logic instructions: a code s e1 e0 m placed at fp16 bits 15 and 11..9
// (exponent e1 e0, mantissa m) is its e2m1 value times 2^-14, the subnormal
// e = 0 codes included. Each fp16 has a zero low byte, so the codes go first
// to bytes "s 0 0 0 e1 e0 m 0" (hb) and then, by prmt with zero, to the high
// byte of a half. The pairs are elements (0, 2), (4, 6), (1, 3), (5, 7).
__device__ __forceinline__ void e2m1x8_to_f16x2_scaled(std::uint32_t w, std::uint32_t (&out)[4]) {
  const std::uint32_t even = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0E0E0E0Eu);  // hb of elements 0, 2, 4, 6
  const std::uint32_t odd = (w & 0x80808080u) | ((w >> 3) & 0x0E0E0E0Eu);         // hb of elements 1, 3, 5, 7
  out[0] = byte_perm(even, 0u, 0x1404u);
  out[1] = byte_perm(even, 0u, 0x3424u);
  out[2] = byte_perm(odd, 0u, 0x1404u);
  out[3] = byte_perm(odd, 0u, 0x3424u);
}

}  // namespace msa::cuda::indexer
