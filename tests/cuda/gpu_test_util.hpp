// Shared helpers of the GPU tests: skipping without a device, RAII device
// buffers, host<->device copies, DeviceCheck buffers, seeds and sanitizer mode.
//
//   TEST(CudaFoo, Bar) {
//     MSA_SKIP_WITHOUT_GPU();
//     const std::uint64_t seed = msa::test::seed_for(1234);
//     MSA_TRACE_SEED(seed);
//     msa::test::DeviceBuffer<float> out(n);
//     out.poison_nan();
//     ...
//     std::vector<float> host = out.download();
//   }
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/check.cuh"
#include "msa/batch.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

// Skips the current test when no CUDA device is usable (CI compiles with nvcc
// but has no GPU).
#define MSA_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                         \
    if (::msa::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";    \
  } while (0)

// Adds "seed = N" to every failure message of the enclosing scope.
#define MSA_TRACE_SEED(seed) SCOPED_TRACE(::testing::Message() << "seed = " << (seed))

namespace msa::test {

// True under the sanitizer pass (env MSA_SANITIZER=1): keep problems small.
inline bool sanitizer_mode() {
  const char* s = std::getenv("MSA_SANITIZER");
  return s != nullptr && s[0] != '\0' && s[0] != '0';
}

// Picks `small` under the sanitizer and `normal` otherwise.
template <typename T>
T size_for(T normal, T small) {
  return sanitizer_mode() ? small : normal;
}

// The test's seed: `fallback`, or env MSA_SEED when set (to replay a failure).
inline std::uint64_t seed_for(std::uint64_t fallback) {
  const char* s = std::getenv("MSA_SEED");
  if (s != nullptr && s[0] != '\0') return std::strtoull(s, nullptr, 10);
  return fallback;
}

// Waits for the device and turns an asynchronous kernel fault into a test error.
inline void device_sync() { MSA_CUDA_CHECK(cudaDeviceSynchronize()); }

// An owned device array of n elements of T (raw device memory, uninitialized).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { allocate(n); }
  explicit DeviceBuffer(const std::vector<T>& host) {
    allocate(host.size());
    upload(host);
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }

  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }

  // Copies host[0 .. size()) to the device (host.size() must equal size()).
  void upload(const std::vector<T>& host) {
    if (host.size() != size_)
      msa::fail("DeviceBuffer::upload: host has ", host.size(), " elements, buffer ", size_);
    if (size_ > 0) MSA_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  // Synchronous copy of the whole buffer to the host.
  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ > 0) MSA_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // Sets every byte (0xFF poisons floats with NaN and ints with -1).
  void fill_bytes(int byte) {
    if (size_ > 0) MSA_CUDA_CHECK(cudaMemset(data_, byte, bytes()));
  }
  void zero() { fill_bytes(0); }
  // NaN for float / bf16 / fp16 / fp8 payloads (all-ones bytes are NaN in each).
  void poison_nan() { fill_bytes(0xFF); }

 private:
  void allocate(std::size_t n) {
    size_ = n;
    if (n > 0) MSA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  void release() {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Convenience: a device copy of a host vector.
template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& host) {
  return DeviceBuffer<T>(host);
}

// A zeroed DeviceCheck buffer ([8] int64) for the kernels' bad-index records.
class CheckBuffer {
 public:
  CheckBuffer() : words_(8) { words_.zero(); }
  msa::cuda::DeviceCheck get() const { return msa::cuda::DeviceCheck{words_.data()}; }
  void reset() { words_.zero(); }
  // Throws msa::Error describing the first recorded bad entry, if any.
  void read() const { msa::cuda::read_check(get(), nullptr); }
  // The message of the recorded entry, or "" when nothing was recorded.
  std::string message() const {
    try {
      read();
    } catch (const msa::Error& e) {
      return e.what();
    }
    return "";
  }

 private:
  DeviceBuffer<std::int64_t> words_;
};

// A StepView whose pointers are device copies of a BatchMetadata's vectors.
struct DeviceStep {
  DeviceBuffer<std::int32_t> query_start, seq_lens, token_request;
  msa::StepView view;

  explicit DeviceStep(const msa::BatchMetadata& meta)
      : query_start(meta.query_start), seq_lens(meta.seq_lens), token_request(meta.token_request) {
    view = meta.view();
    view.query_start = query_start.data();
    view.seq_lens = seq_lens.data();
    view.token_request = token_request.data();
  }
};

}  // namespace msa::test
