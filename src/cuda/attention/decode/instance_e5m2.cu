// Instances of the attention kernel for e5m2 caches.
#include "cuda/attention/decode/kernel.cuh"
#include "cuda/attention/host/launch.hpp"

namespace msa::cuda::attention {

template void launch_attend<KvKind::e5m2, false>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend<KvKind::e5m2, false>();
template void launch_attend<KvKind::e5m2, true>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend<KvKind::e5m2, true>();
template int row_cluster_capacity<KvKind::e5m2, false>(int);
template int row_cluster_capacity<KvKind::e5m2, true>(int);

}  // namespace msa::cuda::attention
