// Launcher of the wgmma token-tile kernel (prefill/kernel.cuh), instanced in
// prefill/instance_*.cu for bf16 / fp16 caches (KvKind::half, the cache's
// own MMA type), fp8 / nvfp4 caches (widened to bf16, or fp16 when kF16), and
// pages of fp8 codes widened ahead with per-token scales (KvKind::half,
// kScaled).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

// Over p.tile_count tile numbers (one CTA per SM for bf16 / fp16 caches).
template <KvKind kKind, bool kF16, bool kScaled = false>
void launch_attend_wgmma_tiles(const AttendParams& p, const KvMaps& maps, cudaStream_t stream);

template <KvKind kKind, bool kF16, bool kScaled = false>
void prepare_attend_wgmma_tiles();

#define MSA_WGMMA_TILES_EXTERN(KIND, F16)                                                                   \
  extern template void launch_attend_wgmma_tiles<KIND, F16>(const AttendParams&, const KvMaps&, cudaStream_t); \
  extern template void prepare_attend_wgmma_tiles<KIND, F16>();
MSA_WGMMA_TILES_EXTERN(KvKind::half, false)
MSA_WGMMA_TILES_EXTERN(KvKind::half, true)
MSA_WGMMA_TILES_EXTERN(KvKind::e4m3, false)
MSA_WGMMA_TILES_EXTERN(KvKind::e4m3, true)
MSA_WGMMA_TILES_EXTERN(KvKind::e5m2, false)
MSA_WGMMA_TILES_EXTERN(KvKind::e5m2, true)
MSA_WGMMA_TILES_EXTERN(KvKind::nvfp4, false)
MSA_WGMMA_TILES_EXTERN(KvKind::nvfp4, true)
#undef MSA_WGMMA_TILES_EXTERN
extern template void launch_attend_wgmma_tiles<KvKind::half, false, true>(const AttendParams&, const KvMaps&,
                                                                          cudaStream_t);
extern template void launch_attend_wgmma_tiles<KvKind::half, true, true>(const AttendParams&, const KvMaps&,
                                                                         cudaStream_t);
extern template void prepare_attend_wgmma_tiles<KvKind::half, false, true>();
extern template void prepare_attend_wgmma_tiles<KvKind::half, true, true>();

}  // namespace msa::cuda::attention
