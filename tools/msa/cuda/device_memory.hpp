// Device memory and device facts for the GPU subcommands. No CUDA headers here
// (streams are msa::cuda::Stream); the implementation is device_memory.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "msa/cuda.hpp"

namespace msa::tool {

// One cudaMalloc'ed allocation, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

  // Synchronous copies (host memory is pageable) at a byte offset.
  void upload(const void* src, std::size_t bytes, std::size_t offset = 0);
  void download(void* dst, std::size_t bytes, std::size_t offset = 0) const;
  // Sets every byte (synchronous).
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& b, std::size_t count, std::size_t offset_bytes = 0) {
  std::vector<T> v(count);
  if (count) b.download(v.data(), count * sizeof(T), offset_bytes);
  return v;
}

// Blocks until the stream's work is done; throws msa::Error on a CUDA error.
void sync_stream(cuda::Stream stream);
// The device's last error (sticky errors included), as text; empty if none.
std::string device_error();

struct DeviceInfo {
  std::string name;
  int ordinal = 0;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  std::int64_t memory_bytes = 0;
  std::int64_t free_bytes = 0;
  std::int64_t l2_bytes = 0;
  int sm_clock_max_mhz = 0;
  int mem_clock_max_mhz = 0;
  int mem_bus_bits = 0;
};
DeviceInfo device_info();

// Output of a shell command (first line, trimmed), or "" if it fails.
std::string shell_line(const char* command);

}  // namespace msa::tool
