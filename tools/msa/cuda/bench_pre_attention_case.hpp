// One pre-attention case of `msa bench` (bench_pre_attention_case.cpp).
#pragma once

#include "bench_case.hpp"

namespace msa::tool {

// Times cuda::pre_attention on the case's step: `copies` input sets (own qkv
// rows, own cache pages in one pool, pages shuffled per copy) rotated so
// that together they span at least 4x the L2, each call captured in a CUDA
// graph; positions 0 .. n-1, slots through the shuffled pages, the index
// cache through the same slots (bench_step.hpp's pool and graph timing).
// Then times the copy floor (a device copy of half the step's bytes, over as
// many rotated buffer pairs). Fills res.time, res.copy_floor, res.traffic,
// res.copies, res.device_bytes.
void bench_pre_attention(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res);

}  // namespace msa::tool
