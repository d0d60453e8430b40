// Device-side random fills for `msa bench` (and poison patterns for `msa check`):
// large caches are filled on the GPU, never by host loops.
#pragma once

#include <cstdint>

#include "msa/cuda.hpp"
#include "msa/dtype.hpp"

namespace msa::tool {

// count elements of `dtype` (f32, bf16, fp16, fp8_e4m3, fp8_e5m2) set to
// scale * N(0, 1) from a hash of (seed, index), encoded as msa::num does.
//   dst: [count] of dtype
void fill_random(void* dst, std::int64_t count, DType dtype, float scale, std::uint64_t seed,
                 cuda::Stream stream);

// An nvfp4 cache region of `bytes` bytes from a page-aligned base: random e2m1
// codes in the data bytes, e4m3 group scales in [0.25, 1) in the scale bytes,
// random bytes in the padding between pages.
//   base: [bytes / page_stride pages][page_stride bytes]
void fill_nvfp4(void* base, std::int64_t bytes, std::int64_t page_stride, int num_kv_heads,
                std::uint64_t seed, cuda::Stream stream);

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

// count int32 values set to `value`.
void fill_int32(std::int32_t* dst, std::int64_t count, std::int32_t value, cuda::Stream stream);

}  // namespace msa::tool
