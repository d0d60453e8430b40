// Hopper (sm_90a) primitives of the wgmma token-tile kernel: descriptors of
// 128-byte-swizzled shared-memory tiles (wgmma_desc.hpp), wgmma m64n128k16 with fp32
// accumulators (A from shared memory or from registers, B from shared
// memory), the wgmma fences, mbarriers, TMA tensor loads and the proxy fence.
//
// Tiles (prefill/layout.cuh): 16-bit elements, rows of 64 elements
// (128 B), 8-row atoms of 1 KiB whose 16-byte chunk c of row r sits at chunk
// c ^ (r & 7) (the TMA's 128-byte swizzle writes exactly this), 1 KiB aligned.
#pragma once

#include <cstdint>

#include "cuda/common/wgmma_desc.hpp"

namespace msa::cuda::sm90 {

// ---- wgmma ------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across
// the asynchronous wgmma (fence / wait).
template <int N>
__device__ __forceinline__ void fence_registers(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for A fragments in registers (read by a wgmma until its wait).
template <int N>
__device__ __forceinline__ void fence_registers(std::uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
}

// The 64 accumulator operands of an m64n128 fp32 fragment d[64], and their
// register list in the instruction text.
#define MSA_WGMMA_D \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define MSA_WGMMA_D_REGS \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64 x 128 fp32, the warpgroup's fragment) (+)= A (64 x 16, K-major tile at
// descriptor a) x B (16 x 128: a K-major 128 x 16 tile at descriptor b).
// accumulate 0: d = A x B. kFp16 picks fp16 inputs, else bf16.
#define MSA_WGMMA_SS(TYPE)                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " MSA_WGMMA_D_REGS \
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                 \
               : MSA_WGMMA_D                                                                      \
               : "l"(a), "l"(b), "r"(accumulate))
template <bool kFp16>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], std::uint64_t a, std::uint64_t b, int accumulate) {
  if constexpr (kFp16) MSA_WGMMA_SS("f16");
  else MSA_WGMMA_SS("bf16");
}

// d (+)= A (64 x 16 from registers: the m16n8k16 A fragment of each warp's 16
// rows) x B (16 x 128 at descriptor b: an MN-major tile, rows = K, or with
// kKMajorB a K-major 128 x 16 tile as wgmma_ss's B).
#define MSA_WGMMA_RS(TYPE, TRANS_B)                                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " MSA_WGMMA_D_REGS \
               ", {%64, %65, %66, %67}, %68, p, 1, 1, " TRANS_B ";\n}\n"                        \
               : MSA_WGMMA_D                                                                      \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))
template <bool kFp16, bool kKMajorB = false>
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const std::uint32_t (&a)[4], std::uint64_t b,
                                         int accumulate) {
  if constexpr (kKMajorB) {
    if constexpr (kFp16) MSA_WGMMA_RS("f16", "0");
    else MSA_WGMMA_RS("bf16", "0");
  } else {
    if constexpr (kFp16) MSA_WGMMA_RS("f16", "1");
    else MSA_WGMMA_RS("bf16", "1");
  }
}
#undef MSA_WGMMA_SS
#undef MSA_WGMMA_RS
#undef MSA_WGMMA_D
#undef MSA_WGMMA_D_REGS

// Registers per thread of the calling warpgroup (all its threads execute it):
// dec hands registers back, inc waits until the CTA's pool has them.
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- mbarriers ------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialised barriers visible to the async proxy (TMA).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// `count` arrivals at once (1 .. 2^20 - 1).
__device__ __forceinline__ void mbar_arrive_count(std::uint32_t bar, std::uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Waits for the phase of the given parity to complete.
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, std::uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// As mbar_wait, acquiring at cluster scope: for a barrier whose phase other
// CTAs of the cluster complete (st.async, decode/push.cuh).
template <int kParity>
__device__ __forceinline__ void mbar_wait_cluster(std::uint32_t bar) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n}\n" ::"r"(bar),
      "n"(kParity)
      : "memory");
}

// ---- TMA ------------------------------------------------------------------------------
// Loads the box at coordinates (c0, c1, c2, c3) of the 4-D tensor map into
// shared memory at dst; completes `bytes` of the mbarrier's transaction count.
//   map: a __grid_constant__ CUtensorMap (generic address)
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const void* map, std::uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// As tma_load_4d for a 3-D tensor map.
__device__ __forceinline__ void tma_load_3d(std::uint32_t dst, const void* map, std::uint32_t bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// Stores the box at coordinates (c0, c1, c2) of the 3-D tensor map from shared
// memory at src (laid out as the map's swizzle reads it), as part of this
// thread's current bulk group (bulk_commit); rows beyond the map's extents are
// not written.
//   map: a __grid_constant__ CUtensorMap (generic address)
__device__ __forceinline__ void tma_store_3d(const void* map, std::uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}
// Closes this thread's bulk group of stores.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until this thread's committed bulk stores have read their shared
// memory (it may then be overwritten).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Waits until this thread's committed bulk stores are complete.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global
// src to shared dst; completes `bytes` of the mbarrier's transaction count.
__device__ __forceinline__ void bulk_load(std::uint32_t dst, const void* src, std::uint32_t bytes,
                                          std::uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<std::uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later
// async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// x as lane 0 holds it: for values the whole warp shares, so that the
// compiler may keep them (and what derives from them) in uniform registers.
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }
// True on one lane of the (converged) warp, without reading the lane index.
__device__ __forceinline__ bool elect_one() {
  std::uint32_t elected = 0;
  asm volatile(
      "{\n.reg .pred p;\n.reg .b32 lane;\nelect.sync lane|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(elected));
  return elected != 0;
}

// Named barrier `id` (1..15) of `threads` threads (a multiple of 32): sync
// waits for all of them; arrive counts this warp in without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace msa::cuda::sm90
