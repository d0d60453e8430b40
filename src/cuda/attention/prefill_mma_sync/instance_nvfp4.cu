// Instances of the token-tile attention kernel for nvfp4 caches.
#include "cuda/attention/prefill_mma_sync/kernel.cuh"
#include "cuda/attention/host/launch.hpp"

namespace msa::cuda::attention {

template void launch_attend_tiles<KvKind::nvfp4, false>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend_tiles<KvKind::nvfp4, false>();
template void launch_attend_tiles<KvKind::nvfp4, true>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend_tiles<KvKind::nvfp4, true>();

}  // namespace msa::cuda::attention
