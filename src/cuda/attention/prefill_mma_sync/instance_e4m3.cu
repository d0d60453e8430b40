// Instances of the token-tile attention kernel for fp8 e4m3 caches.
#include "cuda/attention/prefill_mma_sync/kernel.cuh"
#include "cuda/attention/host/launch.hpp"

namespace msa::cuda::attention {

template void launch_attend_tiles<KvKind::e4m3, false>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend_tiles<KvKind::e4m3, false>();
template void launch_attend_tiles<KvKind::e4m3, true>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend_tiles<KvKind::e4m3, true>();

}  // namespace msa::cuda::attention
