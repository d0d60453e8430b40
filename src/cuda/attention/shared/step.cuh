// The step as every kernel family reads it on the device.
#pragma once

namespace msa::cuda::attention {

// Absolute position of `token` of request r, or -1 when the row attends nothing
// (padding request, or step data that do not fit together).
//   seq, q0, q1: seq_lens[r], query_start[r], query_start[r + 1]
__device__ __forceinline__ int token_position(int token, int seq, int q0, int q1) {
  if (seq <= 0) return -1;
  const int pos = seq - (q1 - q0) + (token - q0);
  return pos >= 0 && pos < seq ? pos : -1;
}

}  // namespace msa::cuda::attention
