#include "device_memory.hpp"

#include <cstdio>
#include <utility>

#include <cuda_runtime.h>

#include "cuda/common/check.cuh"
#include "msa/error.hpp"

namespace msa::tool {

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    ptr_ = nullptr;
    fail("cudaMalloc of ", bytes, " bytes (", double(bytes) / (1 << 30), " GiB) failed: ",
         cudaGetErrorString(e));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) (void)cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, std::size_t bytes, std::size_t offset) {
  MSA_CHECK(offset + bytes <= bytes_, "upload of ", bytes, " bytes at offset ", offset,
            " overruns a device buffer of ", bytes_, " bytes");
  if (bytes) MSA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* dst, std::size_t bytes, std::size_t offset) const {
  MSA_CHECK(offset + bytes <= bytes_, "download of ", bytes, " bytes at offset ", offset,
            " overruns a device buffer of ", bytes_, " bytes");
  if (bytes) MSA_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(int value) {
  if (bytes_) MSA_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

void sync_stream(cuda::Stream stream) {
  MSA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

std::string device_error() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return {};
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

DeviceInfo device_info() {
  DeviceInfo d;
  MSA_CUDA_CHECK(cudaGetDevice(&d.ordinal));
  cudaDeviceProp prop{};
  MSA_CUDA_CHECK(cudaGetDeviceProperties(&prop, d.ordinal));
  d.name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.memory_bytes = std::int64_t(prop.totalGlobalMem);
  d.l2_bytes = prop.l2CacheSize;
  d.mem_bus_bits = prop.memoryBusWidth;
  int khz = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, d.ordinal) == cudaSuccess) d.sm_clock_max_mhz = khz / 1000;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, d.ordinal) == cudaSuccess)
    d.mem_clock_max_mhz = khz / 1000;
  (void)cudaGetLastError();
  std::size_t free_b = 0, total_b = 0;
  MSA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  d.free_bytes = std::int64_t(free_b);
  return d;
}

std::string shell_line(const char* command) {
  FILE* p = popen(command, "r");
  if (!p) return {};
  char buf[512] = {0};
  std::string line;
  if (std::fgets(buf, sizeof(buf), p)) line = buf;
  const int rc = pclose(p);
  if (rc != 0) return {};
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace msa::tool
