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

// count int32 values set to `value`.
void fill_int32(std::int32_t* dst, std::int64_t count, std::int32_t value, cuda::Stream stream);

}  // namespace msa::tool
