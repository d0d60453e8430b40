// The read floor of a decode / verify case of `msa bench`: a kernel that only
// gathers the K and V blocks the step's attention reads (the same pages of the
// same cache, the block list read from device memory first, no math) into
// shared memory, one CTA per SM with three blocks in flight. Timed like the
// case, it shows what reading those bytes alone costs on this GPU: launch,
// first-load latency and the gather itself.
#pragma once

#include <cstdint>

#include "msa/cuda.hpp"

namespace msa::tool {

// Largest unit the gather takes: the K and V of one KV head's block, 128
// tokens x 2 x 128 bf16 (contiguous in the hnd layout and in nvfp4 caches).
inline constexpr std::int32_t kReadFloorMaxUnit = 65536;

// Copies `count` units of `unit_bytes` bytes each (a multiple of 16, at most
// kReadFloorMaxUnit) into shared memory and discards them. base must be
// 16-byte aligned.
//   offsets: [count] device byte offsets of the units from base
void gather_blocks(const void* base, const std::int64_t* offsets, std::int32_t count, std::int32_t unit_bytes,
                   cuda::Stream stream);

}  // namespace msa::tool
