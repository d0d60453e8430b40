// Instances of the attention kernel for nvfp4 caches.
#include "cuda/attention/decode/kernel.cuh"
#include "cuda/attention/host/launch.hpp"

namespace msa::cuda::attention {

template void launch_attend<KvKind::nvfp4, false>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend<KvKind::nvfp4, false>();
template void launch_attend<KvKind::nvfp4, true>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend<KvKind::nvfp4, true>();
template int row_cluster_capacity<KvKind::nvfp4, false>(int);
template int row_cluster_capacity<KvKind::nvfp4, true>(int);

}  // namespace msa::cuda::attention
