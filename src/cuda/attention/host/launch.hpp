// Launchers of the attention kernels, one translation unit per kernel and KV
// kind (instance_*.cu, prefill_mma_sync/instance_*.cu) so that they compile in parallel;
// attend.cu dispatches.
// Split rows are merged inside the kernel (no separate combine launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

// The row attention kernel over `ctas` CTAs. kF16: fp16 MMA (else bf16).
template <KvKind kKind, bool kF16>
void launch_attend(const AttendParams& p, std::int64_t ctas, cudaStream_t stream);

// Raises the kernel's shared-memory limit on the current device (once).
template <KvKind kKind, bool kF16>
void prepare_attend();

// Clusters of `size` row-kernel CTAs the current device holds at once.
template <KvKind kKind, bool kF16>
int row_cluster_capacity(int size);

// The token-tile kernel (prefill rows, p.tile_tokens > 0) over `ctas` CTAs.
template <KvKind kKind, bool kF16>
void launch_attend_tiles(const AttendParams& p, std::int64_t ctas, cudaStream_t stream);

template <KvKind kKind, bool kF16>
void prepare_attend_tiles();

extern template void launch_attend<KvKind::half, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::half, false>();
extern template void launch_attend<KvKind::half, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::half, true>();
extern template void launch_attend<KvKind::e4m3, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::e4m3, false>();
extern template void launch_attend<KvKind::e4m3, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::e4m3, true>();
extern template void launch_attend<KvKind::e5m2, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::e5m2, false>();
extern template void launch_attend<KvKind::e5m2, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::e5m2, true>();
extern template void launch_attend<KvKind::nvfp4, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::nvfp4, false>();
extern template void launch_attend<KvKind::nvfp4, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend<KvKind::nvfp4, true>();
extern template int row_cluster_capacity<KvKind::half, false>(int);
extern template int row_cluster_capacity<KvKind::half, true>(int);
extern template int row_cluster_capacity<KvKind::e4m3, false>(int);
extern template int row_cluster_capacity<KvKind::e4m3, true>(int);
extern template int row_cluster_capacity<KvKind::e5m2, false>(int);
extern template int row_cluster_capacity<KvKind::e5m2, true>(int);
extern template int row_cluster_capacity<KvKind::nvfp4, false>(int);
extern template int row_cluster_capacity<KvKind::nvfp4, true>(int);
extern template void launch_attend_tiles<KvKind::half, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::half, false>();
extern template void launch_attend_tiles<KvKind::half, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::half, true>();
extern template void launch_attend_tiles<KvKind::e4m3, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::e4m3, false>();
extern template void launch_attend_tiles<KvKind::e4m3, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::e4m3, true>();
extern template void launch_attend_tiles<KvKind::e5m2, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::e5m2, false>();
extern template void launch_attend_tiles<KvKind::e5m2, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::e5m2, true>();
extern template void launch_attend_tiles<KvKind::nvfp4, false>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::nvfp4, false>();
extern template void launch_attend_tiles<KvKind::nvfp4, true>(const AttendParams&, std::int64_t, cudaStream_t);
extern template void prepare_attend_tiles<KvKind::nvfp4, true>();

}  // namespace msa::cuda::attention
