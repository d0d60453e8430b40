// What every operation's binding shares: the CPU engine's options and, on a
// CUDA build, the device guard and the optional device-side index check.
#pragma once

#include <cstdint>

#include "arrays.hpp"
#include "msa/cpu.hpp"

#if MSA_HAVE_CUDA
#include "msa/cuda.hpp"
#endif

namespace msa::py {

inline cpu::Options cpu_options(int num_threads) { return cpu::Options{num_threads, true}; }

#if MSA_HAVE_CUDA
// Makes `device` the current CUDA device for the guard's lifetime (the arrays'
// device, which need not be the caller's current one).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// [8] int64 on the call's device (msa::cuda::DeviceCheck), or none.
cuda::DeviceCheck device_check(const OptArray& check, Placement& where);
#endif

}  // namespace msa::py
