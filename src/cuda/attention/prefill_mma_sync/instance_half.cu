// Instances of the token-tile attention kernel for bf16 / fp16 caches.
#include "cuda/attention/prefill_mma_sync/kernel.cuh"
#include "cuda/attention/host/launch.hpp"

namespace msa::cuda::attention {

template void launch_attend_tiles<KvKind::half, false>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend_tiles<KvKind::half, false>();
template void launch_attend_tiles<KvKind::half, true>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend_tiles<KvKind::half, true>();

}  // namespace msa::cuda::attention
