// The read ceiling of `msa bench`: the bandwidth of a kernel that only reads a
// buffer far beyond L2 (no writes but one tiny result per CTA, so that the
// compiler keeps the loads). The copy ceiling counts reads and writes, and a
// kernel that only reads (the indexer, attention) can pass it; this is the
// bound such a kernel can reach. Several variants (bench_read_ceiling.cu) differ in
// the load instruction, the 16-byte loads each thread keeps in flight, the CTA
// size and the grid; each is timed like the copy ceiling, and the fastest is
// the ceiling.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msa/cuda.hpp"

namespace msa::tool {

struct ReadVariantTime {
  std::string name;   // e.g. "nc-u8-t256-c4": ld.global.nc, 8 loads in flight, 256 threads, 4 CTAs per SM
  std::string about;  // the same in words
  int grid = 0;       // CTAs launched (persistent variants: no more per SM than fit at once)
  double ms = 0.0;    // median of the replays
  double gbps = 0.0;  // bytes / ms
};

// The variants' names, in the order they are timed.
std::vector<std::string> read_variant_names();

// Times every variant whose name is in `only` (empty: all) reading `bytes`
// (a multiple of 1 MiB) of device memory: median of `replays` after two
// warm-up runs each.
std::vector<ReadVariantTime> measure_read_variants(std::int64_t bytes, int replays, const std::vector<std::string>& only,
                                                   cuda::Stream stream);

}  // namespace msa::tool
