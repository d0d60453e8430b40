// The copy floor of a pre-attention case of `msa bench`: a kernel that copies
// bytes from one device buffer to another on the SMs, as the step's own kernel
// moves its bytes. (A device-to-device memcpy captured in a CUDA graph may run
// on a copy engine, slower than the SMs on large copies.)
#pragma once

#include <cstddef>

#include "msa/cuda.hpp"

namespace msa::tool {

// Copies `bytes` (a multiple of 16) from src to dst, both 16-byte aligned and
// not overlapping, with a grid of a few CTAs per SM.
void copy_on_sms(void* dst, const void* src, std::size_t bytes, cuda::Stream stream);

}  // namespace msa::tool
