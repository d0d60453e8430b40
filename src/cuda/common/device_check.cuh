// Device side of msa::cuda::DeviceCheck (contract 8): a kernel that meets a bad
// index skips it and records it here; only the first recorded entry is kept.
//
// Buffer layout ([8] int64, zeroed by reset_check):
//   [0] kind (0 = nothing recorded)   [1] i0   [2] i1   [3] i2   [4] value
//   [5] c0   [6] c1   [7] unused
// What the indices and the context values mean depends on the kind:
//   kBadTopkId           i0 = token t, i1 = KV head h, i2 = column k, value = the id,
//                        c0 = request r, c1 = blocks eligible for the row (p / 128 + 1)
//   kBadBlockTable       i0 = request r, i1 = logical block b, value = the page,
//                        c0 = pages in the main cache
//   kBadSlot             i0 = token i, value = the slot, c0 = pages in the cache
//   kBadIndexBlockTable  like kBadBlockTable, for the index cache's block table
//   kBadPosition         i0 = token i, value = the position, c0 = rows of the cos/sin table
//   kBadIndexSlot        i0 = token i, value = the index slot, c0 = pages in the index cache
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace msa::cuda::detail {

enum CheckKind : int {
  kCheckNone = 0,
  kBadTopkId = 1,
  kBadBlockTable = 2,
  kBadSlot = 3,
  kBadIndexBlockTable = 4,
  kBadPosition = 5,
  kBadIndexSlot = 6,
};

inline constexpr int kCheckWords = 8;

// Records a bad entry unless one is already recorded. No-op when buffer is null.
//   buffer: [8] int64 device memory
__device__ __forceinline__ void record_bad(std::int64_t* buffer, int kind, std::int64_t i0,
                                           std::int64_t i1, std::int64_t i2, std::int64_t value,
                                           std::int64_t c0 = -1, std::int64_t c1 = -1) {
  if (buffer == nullptr) return;
  auto* word = reinterpret_cast<unsigned long long*>(buffer);
  if (atomicCAS(word, 0ull, static_cast<unsigned long long>(kind)) != 0ull) return;
  // This thread won: the fields are read only after the kernel has finished.
  buffer[1] = i0;
  buffer[2] = i1;
  buffer[3] = i2;
  buffer[4] = value;
  buffer[5] = c0;
  buffer[6] = c1;
}

}  // namespace msa::cuda::detail
