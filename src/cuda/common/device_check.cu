// Host side of msa::cuda::DeviceCheck: clear the buffer, read it back and turn
// the first recorded bad entry into words.
#include <cstdint>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace {

//   words: [8] the buffer as read back (layout in device_check.cuh)
std::string describe(const std::int64_t* words) {
  const std::int64_t i0 = words[1], i1 = words[2], i2 = words[3], value = words[4];
  const std::int64_t c0 = words[5], c1 = words[6];
  switch (words[0]) {
    case detail::kBadTopkId:
      return msa::detail::concat("topk[t=", i0, ", h=", i1, ", k=", i2, "] = ", value,
                                 " is not an eligible block (request ", c0, " has ", c1,
                                 " eligible blocks)");
    case detail::kBadBlockTable:
      return msa::detail::concat("block_table[r=", i0, ", b=", i1, "] = ", value,
                                 " but the cache has ", c0, " pages");
    case detail::kBadSlot:
      return msa::detail::concat("slots[", i0, "] = ", value, " beyond the cache (", c0,
                                 " pages)");
    case detail::kBadIndexBlockTable:
      return msa::detail::concat("index block_table[r=", i0, ", b=", i1, "] = ", value,
                                 " but the index cache has ", c0, " pages");
    case detail::kBadPosition:
      return msa::detail::concat("positions[", i0, "] = ", value,
                                 " is outside the cos_sin table (max_position = ", c0, " rows)");
    case detail::kBadIndexSlot:
      return msa::detail::concat("index_slots[", i0, "] = ", value, " beyond the index cache (", c0,
                                 " pages)");
    default:
      return msa::detail::concat("device check: unknown kind ", words[0], " (i0=", i0,
                                 ", i1=", i1, ", i2=", i2, ", value=", value, ")");
  }
}

}  // namespace

void reset_check(const DeviceCheck& check, Stream stream) {
  if (check.buffer == nullptr) return;
  MSA_CUDA_CHECK(cudaMemsetAsync(check.buffer, 0, detail::kCheckWords * sizeof(std::int64_t),
                                 static_cast<cudaStream_t>(stream)));
}

void read_check(const DeviceCheck& check, Stream stream) {
  if (check.buffer == nullptr) return;
  std::int64_t words[detail::kCheckWords] = {};
  const auto s = static_cast<cudaStream_t>(stream);
  MSA_CUDA_CHECK(cudaMemcpyAsync(words, check.buffer, sizeof(words), cudaMemcpyDeviceToHost, s));
  MSA_CUDA_CHECK(cudaStreamSynchronize(s));
  if (words[0] != detail::kCheckNone) fail(describe(words));
}

}  // namespace msa::cuda
