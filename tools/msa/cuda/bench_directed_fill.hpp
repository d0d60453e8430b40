// Device fill of the index keys and queries of `msa bench` layer cases
// (bench_directed.hpp says what they are for).
#pragma once

#include <cstdint>

#include "msa/cuda.hpp"
#include "msa/dtype.hpp"

namespace msa::tool {

// Index keys or queries whose dot products pick groups of blocks
// (bench_directed.hpp): value = noise * N(0, 1) + amp * the sum of the
// directions (random signs) of the row's group ids.
struct DirectedFill {
  float noise = 1.0f;
  float amp = 0.0f;
  std::uint64_t noise_seed = 1;      // the N(0, 1) part, by (row, element)
  std::uint64_t direction_seed = 2;  // the directions, by group id: the same for keys and queries
};

// `rows` rows of 128 values; row i takes the ids sets[i / rows_per_set] (-1:
// none; sets may be null). bf16 and fp8_e4m3 rows are 128 elements
// (saturating casts); nvfp4 rows are index_nvfp4 rows of 72 bytes (global
// scale 1: group scales nvfp4_group_scale(amax, 1), codes nvfp4_encode).
//   dst: [rows, 128] of dtype, or [rows, 72] bytes for nvfp4
//   sets: [ceil(rows / rows_per_set), set_size] group ids
void fill_directed(void* dst, std::int64_t rows, DType dtype, const std::int64_t* sets, int set_size,
                   std::int64_t rows_per_set, const DirectedFill& f, cuda::Stream stream);


}  // namespace msa::tool
