// Thin wrappers over the PTX instructions the attention kernels use:
// cp.async, ldmatrix / stmatrix, mma.sync m16n8k16 (bf16 / fp16 -> fp32) and the packed
// conversions to the 16-bit MMA types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace msa::cuda {

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async ------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// Copies src_bytes (0 or 16) and zero-fills the rest of the 16 bytes.
__device__ __forceinline__ void cp_async16_zfill(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
// As cp_async16_zfill, with an L2 cache policy (l2_evict_first).
__device__ __forceinline__ void cp_async16_zfill(std::uint32_t dst, const void* src, int src_bytes,
                                                 std::uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy)
               : "memory");
}
// An L2 policy for data read once: its lines are the first to leave L2, so
// that a streamed KV cache does not push out what the kernel reads again
// (its code, parameters, block lists) between launches.
__device__ __forceinline__ std::uint64_t l2_evict_first() {
  std::uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void cp_async4_zfill(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async4(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix ------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- stmatrix -----------------------------------------------------------------
// Stores four 8 x 8 matrices of 16-bit pairs: r[m] holds lane l's pair (row
// l / 4, columns 2 (l % 4), + 1) of matrix m, and lanes 8m .. 8m + 7 give the
// shared addresses of matrix m's rows (16 bytes each).
__device__ __forceinline__ void stmatrix_x4(std::uint32_t addr, std::uint32_t r0, std::uint32_t r1, std::uint32_t r2,
                                            std::uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// ---- mma.sync m16n8k16, fp32 accumulate ------------------------------------------
// c += a (16x16, row) * b (16x8, col); kFp16 picks fp16 inputs, else bf16.
template <bool kFp16>
__device__ __forceinline__ void mma16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  if constexpr (kFp16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- special functions ------------------------------------------------------------
inline constexpr float kLn2 = 0.6931471805599453f;  // lse: log2 units to natural log

// 2^x with the hardware approximation (rel. error ~2^-22; results below 2^-126
// flush to 0, exp2(-inf) = 0): the softmax exponent, far below the bf16 / fp16
// rounding of the probabilities.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- conversions to the MMA type ---------------------------------------------------
// Two floats -> packed 16-bit pair (lo in the low half), round to nearest even.
template <bool kFp16>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  std::uint32_t r;
  if constexpr (kFp16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const std::uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const std::uint32_t*>(&h);
  }
  return r;
}

// Two fp8 codes (low byte = first element) -> fp16 pair, exact.
__device__ __forceinline__ std::uint32_t e4m3x2_to_f16x2(std::uint16_t v) {
  std::uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(v));
  return r;
}
__device__ __forceinline__ std::uint32_t e5m2x2_to_f16x2(std::uint16_t v) {
  std::uint32_t r;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(r) : "h"(v));
  return r;
}
// fp16 pair -> the MMA type (identity for fp16; exact for the values fp8 and
// nvfp4 decode to, which bf16 holds exactly).
template <bool kFp16>
__device__ __forceinline__ std::uint32_t f16x2_to_mma(std::uint32_t v) {
  if constexpr (kFp16) {
    return v;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&v));
    return pack2<false>(f.x, f.y);
  }
}
// Elementwise product of two packed pairs of the MMA type.
template <bool kFp16>
__device__ __forceinline__ std::uint32_t mul2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t r;
  if constexpr (kFp16) {
    const __half2 p = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    r = *reinterpret_cast<const std::uint32_t*>(&p);
  } else {
    const __nv_bfloat162 p = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                     *reinterpret_cast<const __nv_bfloat162*>(&b));
    r = *reinterpret_cast<const std::uint32_t*>(&p);
  }
  return r;
}

}  // namespace msa::cuda
