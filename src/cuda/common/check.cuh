// CUDA error handling: every runtime call is checked and turned into msa::Error
// with the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include "msa/error.hpp"

#define MSA_CUDA_CHECK(call)                                                              \
  do {                                                                                    \
    const cudaError_t msa_err_ = (call);                                                  \
    if (msa_err_ != cudaSuccess)                                                          \
      ::msa::fail("CUDA error ", cudaGetErrorName(msa_err_), " (", cudaGetErrorString(msa_err_), \
                  ") in ", #call, " at ", __FILE__, ":", __LINE__);                       \
  } while (0)

// Checks the last launch (configuration errors) without synchronizing.
#define MSA_CUDA_CHECK_LAUNCH() MSA_CUDA_CHECK(cudaGetLastError())
