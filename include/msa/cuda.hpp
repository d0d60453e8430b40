// The CUDA backend (sm_90a). Host-callable; no CUDA headers: streams are passed
// as void* (a cudaStream_t).
#pragma once

namespace msa::cuda {

// Usable CUDA devices; 0 when there is no driver or device (never throws).
int device_count();

}  // namespace msa::cuda
