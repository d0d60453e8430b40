#include "timer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "cuda/common/check.cuh"
#include "msa/error.hpp"

namespace msa::tool {

namespace {

cudaStream_t as_stream(cuda::Stream s) { return static_cast<cudaStream_t>(s); }

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Keeps the stream busy for about `ns` nanoseconds.
__global__ void spin_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_ns();
  while (global_ns() - start < ns) {
  }
}

// Events created once and reused.
struct EventPool {
  std::vector<cudaEvent_t> events;
  ~EventPool() {
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
  }
  cudaEvent_t get(std::size_t i) {
    while (events.size() <= i) {
      cudaEvent_t e = nullptr;
      MSA_CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    return events[i];
  }
};

// Does nothing: the launch floor's kernel.
__global__ void empty_kernel() {}

}  // namespace

GraphExec::GraphExec(const std::function<void()>& body, cuda::Stream stream) {
  cudaStream_t s = as_stream(stream);
  MSA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    (void)cudaStreamEndCapture(s, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  if (end != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    fail("capturing the step in a CUDA graph failed: ", cudaGetErrorName(end), " (",
         cudaGetErrorString(end), "); does it allocate or synchronize?");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    fail("instantiating the captured CUDA graph failed: ", cudaGetErrorString(inst));
  }
  exec_ = exec;
}

GraphExec::~GraphExec() {
  if (exec_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

GraphExec::GraphExec(GraphExec&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}

GraphExec& GraphExec::operator=(GraphExec&& other) noexcept {
  if (this != &other) {
    if (exec_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

void GraphExec::launch(cuda::Stream stream) const {
  MSA_CHECK(exec_ != nullptr, "GraphExec::launch: no graph");
  MSA_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), as_stream(stream)));
}

std::vector<float> time_replays(const std::function<void(int)>& launch, int warmup, int replays,
                                cuda::Stream stream) {
  static EventPool pool;
  cudaStream_t s = as_stream(stream);
  for (int i = 0; i < warmup; ++i) launch(i);
  // Head start for the host: about 15 us of GPU time per replay to enqueue, at most 20 ms.
  const std::uint64_t spin_ns = std::min<std::uint64_t>(20'000'000ull, 100'000ull + 15'000ull * std::uint64_t(replays));
  spin_kernel<<<1, 1, 0, s>>>(spin_ns);
  MSA_CUDA_CHECK_LAUNCH();
  for (int i = 0; i < replays; ++i) {
    MSA_CUDA_CHECK(cudaEventRecord(pool.get(2 * std::size_t(i)), s));
    launch(warmup + i);
    MSA_CUDA_CHECK(cudaEventRecord(pool.get(2 * std::size_t(i) + 1), s));
  }
  MSA_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> ms(std::size_t(std::max(replays, 0)));
  for (int i = 0; i < replays; ++i)
    MSA_CUDA_CHECK(cudaEventElapsedTime(&ms[std::size_t(i)], pool.get(2 * std::size_t(i)), pool.get(2 * std::size_t(i) + 1)));
  return ms;
}

float time_once(const std::function<void(int)>& launch, int n, cuda::Stream stream) {
  cudaStream_t s = as_stream(stream);
  cudaEvent_t a = nullptr, b = nullptr;
  MSA_CUDA_CHECK(cudaEventCreate(&a));
  MSA_CUDA_CHECK(cudaEventCreate(&b));
  MSA_CUDA_CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < n; ++i) launch(i);
  MSA_CUDA_CHECK(cudaEventRecord(b, s));
  MSA_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  MSA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  return ms;
}

std::vector<float> time_empty_graph(int ctas, int replays, cuda::Stream stream) {
  const GraphExec graph(
      [&] {
        empty_kernel<<<dim3(static_cast<unsigned>(ctas > 0 ? ctas : 1)), dim3(128), 0, as_stream(stream)>>>();
        MSA_CUDA_CHECK_LAUNCH();
      },
      stream);
  return time_replays([&](int) { graph.launch(stream); }, 10, replays, stream);
}

}  // namespace msa::tool
