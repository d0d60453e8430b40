// Instances of the key-major attention kernel (bf16 / fp16 caches).
#include "cuda/attention/prefill/kernel.cuh"
#include "cuda/attention/key_major/key_major.hpp"

namespace msa::cuda::attention {

template void launch_attend_key_major<false>(const AttendParams&, const KvMaps&, cudaStream_t);
template void launch_attend_key_major<true>(const AttendParams&, const KvMaps&, cudaStream_t);
template void prepare_attend_key_major<false>();
template void prepare_attend_key_major<true>();

}  // namespace msa::cuda::attention
