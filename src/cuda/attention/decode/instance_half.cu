// Instances of the attention kernel for bf16 / fp16 caches.
#include "cuda/attention/decode/kernel.cuh"
#include "cuda/attention/host/launch.hpp"

namespace msa::cuda::attention {

template void launch_attend<KvKind::half, false>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend<KvKind::half, false>();
template void launch_attend<KvKind::half, true>(const AttendParams&, std::int64_t, cudaStream_t);
template void prepare_attend<KvKind::half, true>();
template int row_cluster_capacity<KvKind::half, false>(int);
template int row_cluster_capacity<KvKind::half, true>(int);

}  // namespace msa::cuda::attention
