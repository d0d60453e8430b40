// The machine's ceilings, measured in the same run as the benchmark:
//  - copy: device-to-device cudaMemcpyAsync of `copy_bytes` (>= 1 GiB), counting
//    bytes read + written (2 x copy_bytes per copy), median of the replays;
//  - gemm: a bf16 x bf16 -> bf16 GEMM of n^3 with fp32 accumulation through
//    cuBLAS on random data, 2 n^3 FLOP, median of the replays;
//  - gemm_fp8: the same with e4m3 x e4m3 inputs (cuBLASLt, A transposed as
//    its fp8 kernels require): the bound of MMAs on fp8 tensor cores;
//  - launch: a CUDA graph of one empty kernel (one CTA per SM), timed like a
//    bench case: the fixed cost no one-launch run step can go below;
//  - read: a kernel that only reads `read_bytes` (4 GiB), the fastest of the
//    variants of bench_read_ceiling.hpp, each timed like the copy: the bound of a
//    kernel that reads and hardly writes (the indexer, attention).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msa/cuda.hpp"
#include "bench_read_ceiling.hpp"

namespace msa::tool {

struct Ceilings {
  std::int64_t copy_bytes = 0;  // bytes of one copy (read once, written once)
  double copy_ms = 0.0;         // median
  double copy_gbps = 0.0;       // 2 * copy_bytes / copy_ms
  int gemm_n = 0;
  double gemm_ms = 0.0;         // median
  double gemm_tflops = 0.0;     // 2 n^3 / gemm_ms
  double gemm_fp8_ms = 0.0;     // median, same n
  double gemm_fp8_tflops = 0.0;  // 2 n^3 / gemm_fp8_ms
  double launch_us = 0.0;       // median
  std::int64_t read_bytes = 0;  // bytes one read pass reads
  double read_ms = 0.0;         // median of the fastest variant
  double read_gbps = 0.0;       // read_bytes / read_ms
  std::string read_variant;     // the fastest variant's name
  std::vector<ReadVariantTime> read_variants;  // every variant timed
};

// read_only: the read variants to time (empty: all of them).
Ceilings measure_ceilings(cuda::Stream stream, int replays, const std::vector<std::string>& read_only = {});

}  // namespace msa::tool
