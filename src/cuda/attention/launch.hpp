// Launchers of the attention kernels, one translation unit per KV kind
// (instance_*.cu) so that they compile in parallel; attend.cu dispatches.
// Split rows are merged inside the kernel (no separate combine launch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/attention/params.cuh"

namespace msa::cuda::attention {

// The attention kernel over `ctas` CTAs. kF16: fp16 MMA (else bf16).
template <KvKind kKind, bool kF16>
void launch_attend(const AttendParams& p, std::int64_t ctas, cudaStream_t stream);

// Raises the kernel's shared-memory limit on the current device (once).
template <KvKind kKind, bool kF16>
void prepare_attend();

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

}  // namespace msa::cuda::attention
