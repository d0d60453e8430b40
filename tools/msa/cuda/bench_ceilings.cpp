#include "bench_ceilings.hpp"

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
    c.gemm_tflops = 2.0 * double(n) * double(n) * double(n) / (c.gemm_ms * 1e-3) * 1e-12;
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
