// Small definitions shared by every public header. No CUDA headers here: the
// host-device qualifier is spelled only when nvcc compiles the file.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MSA_HD __host__ __device__ __forceinline__
#else
#define MSA_HD inline
#endif

namespace msa {

// Tokens per KV page, which is also the sparse block size (contract 1).
inline constexpr int kBlockSize = 128;
// The only supported head dimension for q, k, v and the index vectors.
inline constexpr int kHeadDim = 128;
// Largest supported top-k and GQA group.
inline constexpr int kMaxTopk = 64;
inline constexpr int kMaxGroup = 16;

}  // namespace msa
