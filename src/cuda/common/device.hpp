// Facts of the current CUDA device that host-side launch and plan code asks for.
#pragma once

namespace msa::cuda {

// Streaming multiprocessors of the current device.
int device_sm_count();

}  // namespace msa::cuda
