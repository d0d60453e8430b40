// A layer case of `msa bench` (bench_layer.cpp): one engine step of one sparse
// layer, the step's new K, V and index keys inserted, the indexer, and the
// attention over the top-k the indexer just wrote.
#pragma once

#include "bench_case.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

// Builds the case's inputs, times the whole layer step and each stage alone
// (each captured in a CUDA graph per input copy) into res.
void bench_layer(const BenchCase& c, const BenchSettings& s, cuda::Stream stream, BenchResult& res);

}  // namespace msa::tool
