// Launchers of the row kernel (decode/) and the mma.sync token tiles
// (prefill_mma_sync/), instanced per KV kind in generated translation units
// (instances.cmake, host/instances.hpp) so that they compile in parallel;
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

}  // namespace msa::cuda::attention
