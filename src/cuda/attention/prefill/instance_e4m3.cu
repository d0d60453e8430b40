// Instances of the wgmma token-tile attention kernel for e4m3 caches.
#include "cuda/attention/prefill/kernel.cuh"
#include "cuda/attention/host/launch_wgmma.hpp"

namespace msa::cuda::attention {

template void launch_attend_wgmma_tiles<KvKind::e4m3, false>(const AttendParams&, const KvMaps&, cudaStream_t);
template void launch_attend_wgmma_tiles<KvKind::e4m3, true>(const AttendParams&, const KvMaps&, cudaStream_t);
template void prepare_attend_wgmma_tiles<KvKind::e4m3, false>();
template void prepare_attend_wgmma_tiles<KvKind::e4m3, true>();

}  // namespace msa::cuda::attention
