// The device copy of a step's arrays (msa::cuda::upload_step): query_start,
// seq_lens and token_request, each 256-byte aligned in the caller's workspace.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/common/check.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the three arrays.
struct StepLayout {
  std::size_t query_start = 0, seq_lens = 0, token_request = 0, bytes = 0;
};
StepLayout layout_of(const BatchMetadata& meta) {
  StepLayout l;
  l.seq_lens = aligned(meta.query_start.size() * sizeof(std::int32_t));
  l.token_request = l.seq_lens + aligned(meta.seq_lens.size() * sizeof(std::int32_t));
  l.bytes = l.token_request + aligned(meta.token_request.size() * sizeof(std::int32_t));
  return l;
}

}  // namespace

std::size_t step_workspace_bytes(const BatchMetadata& meta) { return layout_of(meta).bytes; }

StepView upload_step(const BatchMetadata& meta, const Workspace& workspace, Stream stream) {
  const StepLayout l = layout_of(meta);
  MSA_CHECK(workspace.bytes >= l.bytes, "upload_step: workspace.bytes = ", workspace.bytes, " but the step's ",
            meta.num_requests, " requests and ", meta.num_tokens, " tokens need ", l.bytes,
            " (step_workspace_bytes)");
  MSA_CHECK(l.bytes == 0 || workspace.data != nullptr, "upload_step: workspace.data is null");
  MSA_CHECK(reinterpret_cast<std::uintptr_t>(workspace.data) % 16 == 0,
            "upload_step: workspace.data is not 16-byte aligned");
  auto* base = static_cast<unsigned char*>(workspace.data);
  const auto s = static_cast<cudaStream_t>(stream);
  auto copy = [&](std::size_t offset, const std::vector<std::int32_t>& v) {
    if (!v.empty())
      MSA_CUDA_CHECK(cudaMemcpyAsync(base + offset, v.data(), v.size() * sizeof(std::int32_t),
                                     cudaMemcpyHostToDevice, s));
    return reinterpret_cast<const std::int32_t*>(base + offset);
  };
  StepView view = meta.view();
  view.query_start = copy(l.query_start, meta.query_start);
  view.seq_lens = copy(l.seq_lens, meta.seq_lens);
  view.token_request = copy(l.token_request, meta.token_request);
  return view;
}

}  // namespace msa::cuda
