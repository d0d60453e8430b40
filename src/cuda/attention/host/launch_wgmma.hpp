// Launcher of the wgmma token-tile kernel (prefill/kernel.cuh), instanced
// (instances.cmake) for bf16 / fp16 caches (KvKind::half, the cache's
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

}  // namespace msa::cuda::attention
