// Launcher of the wgmma token-tile kernel (kernel_wgmma_tile.cuh), instanced in
// instance_wgmma_tiles.cu for bf16 (kF16 false) and fp16 (true) caches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/kv_maps.hpp"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

template <bool kF16>
void launch_attend_wgmma_tiles(const AttendParams& p, const KvMaps& maps, std::int64_t ctas, cudaStream_t stream);

template <bool kF16>
void prepare_attend_wgmma_tiles();

extern template void launch_attend_wgmma_tiles<false>(const AttendParams&, const KvMaps&, std::int64_t,
                                                      cudaStream_t);
extern template void launch_attend_wgmma_tiles<true>(const AttendParams&, const KvMaps&, std::int64_t,
                                                     cudaStream_t);
extern template void prepare_attend_wgmma_tiles<false>();
extern template void prepare_attend_wgmma_tiles<true>();

}  // namespace msa::cuda::attention
