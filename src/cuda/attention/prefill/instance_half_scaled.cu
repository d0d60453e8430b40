// Instances of the wgmma token-tile attention kernel over bf16 / fp16 pages of
// fp8 codes widened ahead with their per-token scales (widen.hpp).
#include "cuda/attention/prefill/kernel.cuh"
#include "cuda/attention/host/launch_wgmma.hpp"

namespace msa::cuda::attention {

template void launch_attend_wgmma_tiles<KvKind::half, false, true>(const AttendParams&, const KvMaps&, cudaStream_t);
template void launch_attend_wgmma_tiles<KvKind::half, true, true>(const AttendParams&, const KvMaps&, cudaStream_t);
template void prepare_attend_wgmma_tiles<KvKind::half, false, true>();
template void prepare_attend_wgmma_tiles<KvKind::half, true, true>();

}  // namespace msa::cuda::attention
