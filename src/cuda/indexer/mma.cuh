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

}  // namespace msa::cuda::indexer
