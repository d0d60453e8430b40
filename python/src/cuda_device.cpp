// CUDA-only helpers of the bindings (built with the CUDA backend).
#include <cuda_runtime.h>

#include "backend.hpp"
#include "msa/error.hpp"

namespace msa::py {

namespace {
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}
}  // namespace

DeviceGuard::DeviceGuard(int device) {
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

cuda::DeviceCheck device_check(const OptArray& check, Placement& where) {
  if (!check) return {};
  where.add(*check, "check");
  expect_int64(*check, "check");
  expect_shape(*check, {8}, "check", "[8] int64");
  expect_contiguous(*check, "check");
  return cuda::DeviceCheck{ptr<std::int64_t>(*check)};
}

}  // namespace msa::py
