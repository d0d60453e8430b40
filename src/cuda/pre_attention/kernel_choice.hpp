// The two pre-attention kernels (pre_attention.cu): msa::cuda::pre_attention
// picks one by the step's size and alignment; tests run each on every case.
#pragma once

#include "msa/cuda.hpp"
#include "msa/pre_attention.hpp"

namespace msa::cuda::pre_detail {

enum class Kernel {
  automatic,  // the choice of msa::cuda::pre_attention
  warps,      // warps that each load their own row parts, in contiguous runs (short steps, unaligned rows)
  strided,    // the warps' kernel taking its steps in strided passes (aligned rows)
  staged,     // rows copied in bulk into shared-memory stages (staged_kernel.cuh)
};

// msa::cuda::pre_attention with the kernel named; `staged` runs the warps'
// kernel where rows or outputs do not start on 16 bytes.
void pre_attention_with(Kernel kernel, const KVCacheView& cache, const IndexCacheView& index_cache,
                        const PreAttentionArgs& args, Stream stream, const DeviceCheck& check);

}  // namespace msa::cuda::pre_detail
