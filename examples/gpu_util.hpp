// Small helpers of the GPU examples: device copies of host vectors, random bf16
// inputs, and the largest difference between two results.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "msa/numeric.hpp"

namespace example {

using bf16 = std::uint16_t;  // bf16 bits; msa::num converts them

inline void cuda_ok(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}
// Device memory for n values (never freed: the examples end with the process).
template <typename T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  if (n > 0) cuda_ok(cudaMalloc(&p, n * sizeof(T)));
  return p;
}
// Copies on `stream`; a pageable source is staged before the call returns.
template <typename T>
void upload(T* device, const std::vector<T>& host, cudaStream_t stream = nullptr) {
  cuda_ok(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
}
template <typename T>
T* to_device(const std::vector<T>& host) {
  T* p = device_alloc<T>(host.size());
  upload(p, host);
  return p;
}
template <typename T>
std::vector<T> download(const T* device, std::size_t n) {
  std::vector<T> host(n);
  cuda_ok(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// n unit-normal values rounded to bf16, standing in for a model's projections.
inline std::vector<bf16> random_bf16(std::size_t n) {
  static std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<bf16> v(n);
  for (bf16& x : v) x = msa::num::float_to_bf16(normal(rng));
  return v;
}

inline float value(bf16 x) { return msa::num::bf16_to_float(x); }
inline float value(float x) { return x; }
// max |a[i] - b[i]| over bf16 or float results.
template <typename T>
double max_error(const std::vector<T>& a, const std::vector<T>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::fmax(e, std::fabs(double(value(a[i])) - value(b[i])));
  return e;
}

}  // namespace example
