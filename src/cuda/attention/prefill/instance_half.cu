// Instances of the wgmma token-tile attention kernel for bf16 / fp16 caches.
#include "cuda/attention/prefill/kernel.cuh"
#include "cuda/attention/host/launch_wgmma.hpp"

namespace msa::cuda::attention {

template void launch_attend_wgmma_tiles<KvKind::half, false>(const AttendParams&, const KvMaps&, cudaStream_t);
template void launch_attend_wgmma_tiles<KvKind::half, true>(const AttendParams&, const KvMaps&, cudaStream_t);
template void prepare_attend_wgmma_tiles<KvKind::half, false>();
template void prepare_attend_wgmma_tiles<KvKind::half, true>();

}  // namespace msa::cuda::attention
