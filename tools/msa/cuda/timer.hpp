// Replay timing for `msa bench`: CUDA graphs and per-replay CUDA events.
//
// time_replays() first enqueues a short GPU spin (a kernel that waits on the
// global timer) so that the host can queue every replay before the GPU starts
// them: the replays then run back to back, and the events around each one
// measure the GPU's time for it, not the host's launch rate.
#pragma once

#include <functional>
#include <vector>

#include "msa/cuda.hpp"

namespace msa::tool {

// An instantiated CUDA graph captured from the work `body` enqueues on the
// stream. Capture uses cudaStreamCaptureModeThreadLocal, so a body that
// allocates or synchronizes fails here with the CUDA error in the message.
class GraphExec {
 public:
  GraphExec() = default;
  GraphExec(const std::function<void()>& body, cuda::Stream stream);
  ~GraphExec();
  GraphExec(GraphExec&& other) noexcept;
  GraphExec& operator=(GraphExec&& other) noexcept;
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;

  void launch(cuda::Stream stream) const;

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// Runs launch(i) for i in [0, warmup) untimed, then for i in [warmup,
// warmup + replays) between two events each; returns the milliseconds of each
// timed replay. Synchronizes the stream.
std::vector<float> time_replays(const std::function<void(int)>& launch, int warmup, int replays,
                                cuda::Stream stream);

// Milliseconds the GPU takes for launch(0..n-1) in one go (no spin, one event pair).
float time_once(const std::function<void(int)>& launch, int n, cuda::Stream stream);

// The launch floor: replay times (ms) of a CUDA graph holding one empty kernel
// of `ctas` CTAs, timed like a bench case (time_replays): the least any
// one-launch run step can measure.
std::vector<float> time_empty_graph(int ctas, int replays, cuda::Stream stream);

}  // namespace msa::tool
