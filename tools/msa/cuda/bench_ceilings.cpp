#include "bench_ceilings.hpp"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "bench_accounting.hpp"
#include "cuda/common/check.cuh"
#include "device_memory.hpp"
#include "fill.hpp"
#include "msa/error.hpp"
#include "timer.hpp"

namespace msa::tool {

namespace {

#define MSA_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                         \
    const cublasStatus_t msa_st_ = (call);                                                     \
    if (msa_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::msa::fail("cuBLAS error ", cublasGetStatusString(msa_st_), " in ", #call, " at ", __FILE__, \
                  ":", __LINE__);                                                              \
  } while (0)

struct Cublas {
  cublasHandle_t handle = nullptr;
  Cublas() { MSA_CUBLAS_CHECK(cublasCreate(&handle)); }
  ~Cublas() {
    if (handle) (void)cublasDestroy(handle);
  }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
};

// The cuBLASLt objects of one fp8 GEMM, destroyed in reverse order.
struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtGemm() = default;
  ~LtGemm() {
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (d) (void)cublasLtMatrixLayoutDestroy(d);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (op) (void)cublasLtMatmulDescDestroy(op);
    if (handle) (void)cublasLtDestroy(handle);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
};

// Median ms of D = A^T B for n x n e4m3 A, B and bf16 D (fp32 accumulation):
// the "TN" form cuBLASLt's fp8 kernels take, with the algorithm its heuristic
// ranks first.
double fp8_gemm_ms(int n, int replays, cuda::Stream stream) {
  const std::int64_t elems = std::int64_t(n) * n;
  const auto bytes = static_cast<std::size_t>(elems);
  DeviceBuffer a(bytes), b(bytes), out(bytes * 2);
  constexpr std::size_t kWorkspace = std::size_t(32) << 20;
  DeviceBuffer workspace(kWorkspace);
  fill_random(a.get(), elems, DType::fp8_e4m3, 1.0f, 4, stream);
  fill_random(b.get(), elems, DType::fp8_e4m3, 1.0f, 5, stream);
  LtGemm g;
  MSA_CUBLAS_CHECK(cublasLtCreate(&g.handle));
  MSA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&g.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  MSA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose));
  MSA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(g.op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
  MSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_8F_E4M3, std::uint64_t(n), std::uint64_t(n), n));
  MSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_8F_E4M3, std::uint64_t(n), std::uint64_t(n), n));
  MSA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_16BF, std::uint64_t(n), std::uint64_t(n), n));
  MSA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&g.pref));
  const std::uint64_t ws = kWorkspace;
  MSA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(g.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  MSA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g.handle, g.op, g.a, g.b, g.d, g.d, g.pref, 1, &best, &found));
  MSA_CHECK(found > 0, "fp8 GEMM ceiling: cuBLASLt has no e4m3 algorithm for n = ", n);
  const float alpha = 1.0f, beta = 0.0f;
  auto gemm = [&](int) {
    MSA_CUBLAS_CHECK(cublasLtMatmul(g.handle, g.op, &alpha, a.get(), g.a, b.get(), g.b, &beta, out.get(), g.d,
                                    out.get(), g.d, &best.algo, workspace.get(), kWorkspace,
                                    static_cast<cudaStream_t>(stream)));
  };
  return summarize_ms(time_replays(gemm, 3, replays, stream)).median_us * 1e-3;
}

}  // namespace

Ceilings measure_ceilings(cuda::Stream stream, int replays, const std::vector<std::string>& read_only) {
  Ceilings c;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  {
    c.copy_bytes = std::int64_t(1) << 30;
    DeviceBuffer src(std::size_t(c.copy_bytes)), dst(std::size_t(c.copy_bytes));
    fill_random(src.get(), c.copy_bytes / 4, DType::f32, 1.0f, 1, stream);
    auto copy = [&](int) {
      MSA_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), std::size_t(c.copy_bytes), cudaMemcpyDeviceToDevice, s));
    };
    const TimeStats t = summarize_ms(time_replays(copy, 2, replays, stream));
    c.copy_ms = t.median_us * 1e-3;
    c.copy_gbps = 2.0 * double(c.copy_bytes) / (c.copy_ms * 1e-3) * 1e-9;
  }
  {
    c.gemm_n = 8192;
    const std::int64_t n = c.gemm_n, elems = n * n;
    DeviceBuffer a(std::size_t(elems) * 2), b(std::size_t(elems) * 2), out(std::size_t(elems) * 2);
    fill_random(a.get(), elems, DType::bf16, 1.0f, 2, stream);
    fill_random(b.get(), elems, DType::bf16, 1.0f, 3, stream);
    Cublas blas;
    MSA_CUBLAS_CHECK(cublasSetStream(blas.handle, s));
    const float alpha = 1.0f, beta = 0.0f;
    const int ni = c.gemm_n;
    auto gemm = [&](int) {
      MSA_CUBLAS_CHECK(cublasGemmEx(blas.handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a.get(), CUDA_R_16BF,
                                    ni, b.get(), CUDA_R_16BF, ni, &beta, out.get(), CUDA_R_16BF, ni,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    const TimeStats t = summarize_ms(time_replays(gemm, 3, replays, stream));
    c.gemm_ms = t.median_us * 1e-3;
    const double flops = 2.0 * double(n) * double(n) * double(n);
    c.gemm_tflops = flops / (c.gemm_ms * 1e-3) * 1e-12;
    c.gemm_fp8_ms = fp8_gemm_ms(ni, replays, stream);
    c.gemm_fp8_tflops = flops / (c.gemm_fp8_ms * 1e-3) * 1e-12;
  }
  {
    int device = 0, sms = 0;
    MSA_CUDA_CHECK(cudaGetDevice(&device));
    MSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    c.launch_us = summarize_ms(time_empty_graph(sms, std::max(replays, 50), stream)).median_us;
  }
  {
    c.read_bytes = std::int64_t(4) << 30;
    c.read_variants = measure_read_variants(c.read_bytes, replays, read_only, stream);
    for (const ReadVariantTime& v : c.read_variants) {
      if (v.gbps <= c.read_gbps) continue;
      c.read_gbps = v.gbps;
      c.read_ms = v.ms;
      c.read_variant = v.name;
    }
  }
  return c;
}

}  // namespace msa::tool
