#include "bench_cp_ranks.hpp"

#include <cuda_runtime.h>
#if defined(MSA_HAVE_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "cuda/common/check.cuh"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "timer.hpp"

namespace msa::tool {

// ---- NCCL ----------------------------------------------------------------------------

#if defined(MSA_HAVE_NCCL)
bool have_nccl() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

CpComms::CpComms(int n) : comms_(std::size_t(std::max(n, 0)), nullptr) {
  MSA_CHECK(n >= 1, "CpComms: n = ", n, " but at least one rank is needed");
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast
  std::vector<int> devices(static_cast<std::size_t>(n));
  std::iota(devices.begin(), devices.end(), 0);
  std::vector<ncclComm_t> comms(std::size_t(n), nullptr);
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  (void)cudaSetDevice(0);
  if (r != ncclSuccess)
    fail("ncclCommInitAll over GPUs 0..", n - 1, " failed: ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")");
  for (int i = 0; i < n; ++i) comms_[std::size_t(i)] = comms[std::size_t(i)];
}

CpComms::~CpComms() {
  for (void* c : comms_)
    if (c) (void)ncclCommDestroy(static_cast<ncclComm_t>(c));
  (void)cudaSetDevice(0);
}
#else
bool have_nccl() { return false; }
std::string nccl_version() { return ""; }

CpComms::CpComms(int n) : comms_(std::size_t(std::max(n, 0)), nullptr) {
  MSA_CHECK(n == 1, "this build has no NCCL (no nccl.h / libnccl at configure time): one rank can run, not ", n);
}
CpComms::~CpComms() = default;
#endif

namespace {

// ---- lockstep ------------------------------------------------------------------------

// The rank threads run the same steps in the same order: each step on every
// rank, then a barrier. After a rank fails, every rank skips the steps that
// follow (a rank that stopped would leave the others waiting in a collective).
class Lockstep {
 public:
  explicit Lockstep(int ranks) : barrier_(ranks) {}

  // Runs fn (unless a rank failed before) and waits for every rank; false once any rank failed.
  bool run(int rank, const std::function<void()>& fn) {
    if (!failed_.load()) {
      try {
        fn();
      } catch (const std::exception& e) {
        fail(rank, e.what());
      }
    }
    barrier_.arrive_and_wait();
    return !failed_.load();
  }
  void fail(int rank, const std::string& what) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) error_ = "rank " + std::to_string(rank) + ": " + what;
    failed_.store(true);
  }
  std::string error() const { return error_; }  // read after the threads joined

 private:
  std::barrier<> barrier_;
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::string error_;
};

// ---- timing --------------------------------------------------------------------------

// CUDA events of the current device, destroyed with the set.
struct EventSet {
  std::vector<cudaEvent_t> events;
  explicit EventSet(std::size_t n) : events(n, nullptr) {
    for (cudaEvent_t& e : events) MSA_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EventSet() {
    for (cudaEvent_t e : events)
      if (e) (void)cudaEventDestroy(e);
  }
  EventSet(const EventSet&) = delete;
  EventSet& operator=(const EventSet&) = delete;
};

using Part = std::function<void()>;
using PartTimes = std::vector<std::vector<float>>;  // [replay][part] milliseconds

// One rank's pass: `warmup` untimed replays, then `replays` timed ones. A
// replay enqueues the parts in order, with an event before the first part and
// after each. The warm-up replays also give the host a head start, so the
// timed ones run back to back on the GPU.
PartTimes time_parts(const std::vector<Part>& parts, int warmup, int replays, cudaStream_t stream) {
  const std::size_t marks = parts.size() + 1;
  for (int i = 0; i < warmup; ++i)
    for (const Part& p : parts) p();
  EventSet ev(std::size_t(replays) * marks);
  for (int i = 0; i < replays; ++i) {
    cudaEvent_t* mark = &ev.events[std::size_t(i) * marks];
    MSA_CUDA_CHECK(cudaEventRecord(mark[0], stream));
    for (std::size_t p = 0; p < parts.size(); ++p) {
      parts[p]();
      MSA_CUDA_CHECK(cudaEventRecord(mark[p + 1], stream));
    }
  }
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  PartTimes ms(std::size_t(replays), std::vector<float>(parts.size()));
  for (int i = 0; i < replays; ++i)
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const cudaEvent_t* mark = &ev.events[std::size_t(i) * marks];
      MSA_CUDA_CHECK(cudaEventElapsedTime(&ms[std::size_t(i)][p], mark[p], mark[p + 1]));
    }
  return ms;
}

// Per replay, the largest time of part `part` over the ranks; summarized.
//   per_rank: [rank][replay][part]
TimeStats slowest_rank(const std::vector<PartTimes>& per_rank, std::size_t part) {
  if (per_rank.empty()) return {};
  std::vector<float> worst(per_rank[0].size(), 0.0f);
  for (const PartTimes& rank : per_rank)
    for (std::size_t i = 0; i < worst.size() && i < rank.size(); ++i) worst[i] = std::max(worst[i], rank[i][part]);
  return summarize_ms(std::move(worst));
}

// ---- comparison ----------------------------------------------------------------------

std::int64_t rows_differing(const std::vector<std::int32_t>& got, const std::vector<std::int32_t>& want, int topk) {
  if (got.size() != want.size()) return std::int64_t(std::max(got.size(), want.size()) / std::size_t(topk));
  std::int64_t rows = 0;
  for (std::size_t i = 0; i < got.size(); i += std::size_t(topk))
    rows += std::equal(got.begin() + std::ptrdiff_t(i), got.begin() + std::ptrdiff_t(i) + topk,
                       want.begin() + std::ptrdiff_t(i)) ? 0 : 1;
  return rows;
}

// sqrt(sum (got - want)^2 / sum want^2) over bf16 values; NaN anywhere gives NaN.
double rel_frobenius_bf16(const std::vector<std::uint16_t>& got, const std::vector<std::uint16_t>& want) {
  if (got.size() != want.size()) return std::nan("");
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = num::bf16_to_float(got[i]), b = num::bf16_to_float(want[i]);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// ---- the ranks -----------------------------------------------------------------------

// What the rank threads share. Each rank writes only its own slots; rank 0
// also the results it downloads.
struct Shared {
  const BenchCase& c;
  const CpSettings& s;
  const CpComms& comms;
  int n;
  cp::Sharding sharding;
  Lockstep gate;
  std::vector<int> graph_ok;
  std::vector<std::string> graph_note;
  std::vector<double> index_bytes, device_bytes;
  double candidate_bytes = 0, partial_bytes = 0;
  std::vector<PartTimes> pilot, step, phases, single_step, single_phases;  // [rank]
  std::vector<std::int32_t> topk, single_topk;                            // rank 0
  std::vector<std::uint16_t> out, single_out;                             // rank 0

  Shared(const BenchCase& c_, const CpSettings& s_, const CpComms& comms_)
      : c(c_), s(s_), comms(comms_), n(comms_.size()), sharding(cp_sharding(c_, n, s_.run_blocks)), gate(n),
        graph_ok(std::size_t(n), 1), graph_note(std::size_t(n)), index_bytes(std::size_t(n)),
        device_bytes(std::size_t(n)), pilot(std::size_t(n)), step(std::size_t(n)), phases(std::size_t(n)),
        single_step(std::size_t(n)), single_phases(std::size_t(n)) {}

  // The timed replays of every pass, from the pilot: all ranks compute the same.
  int replays() const {
    const double pilot_us = slowest_rank(pilot, 0).median_us;
    int r = s.iters;
    if (pilot_us > 0.0) r = std::min(r, std::max(10, int(s.budget_ms * 1e3 / pilot_us)));
    return std::max(r, 1);
  }
};

void rank_main(Shared& sh, int r) {
  cudaStream_t stream = nullptr;
  std::unique_ptr<CpRank> rank;
  std::vector<GraphExec> graphs;
  const bool single = sh.n == 1;
  const auto sr = std::size_t(r);
  Lockstep& gate = sh.gate;

  gate.run(r, [&] {
    MSA_CUDA_CHECK(cudaSetDevice(r));
    MSA_CUDA_CHECK(cudaStreamCreate(&stream));  // blocking: ordered with the setup's synchronous copies
    rank = std::make_unique<CpRank>(sh.c, cuda::cp::Group{sh.comms.comm(r), r, sh.sharding}, sh.s.seed,
                                    sh.s.propose_from_scores, sh.s.merge, stream);
    sh.index_bytes[sr] = rank->index_bytes();
    sh.device_bytes[sr] = rank->device_bytes();
    if (r == 0) {
      sh.candidate_bytes = rank->candidate_bytes();
      sh.partial_bytes = rank->partial_bytes();
    }
  });
  // One eager step: loads the kernels, checks the arguments, gives the results.
  gate.run(r, [&] {
    rank->step(stream);
    MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (r == 0) {
      sh.topk = rank->cp_topk();
      sh.out = rank->cp_output();
    }
    if (single) {
      rank->single_index(stream);
      rank->single_attend(stream);
      sh.single_topk = rank->single_topk();
      sh.single_out = rank->single_output();
    }
  });

  // What a replay runs: 0 the step, 1 its index half, 2 its attend half; with
  // one rank also 3 the single-GPU step, 4 and 5 its halves.
  std::vector<std::function<void()>> bodies = {[&] { rank->step(stream); }, [&] { rank->index_phase(stream); },
                                               [&] { rank->attend_phase(stream); }};
  if (single) {
    bodies.push_back([&] {
      rank->single_index(stream);
      rank->single_attend(stream);
    });
    bodies.push_back([&] { rank->single_index(stream); });
    bodies.push_back([&] { rank->single_attend(stream); });
  }
  gate.run(r, [&] {
    if (!sh.s.graph) {
      sh.graph_ok[sr] = 0;
      sh.graph_note[sr] = "--no-graph";
      return;
    }
    try {
      for (const auto& body : bodies) graphs.emplace_back(body, stream);
    } catch (const Error& e) {
      graphs.clear();
      sh.graph_ok[sr] = 0;
      sh.graph_note[sr] = "rank " + std::to_string(r) + ": " + e.what();
    }
  });
  // After that barrier every rank sees every flag: they agree on graphs or direct calls.
  const bool use_graph = std::all_of(sh.graph_ok.begin(), sh.graph_ok.end(), [](int ok) { return ok != 0; });
  auto part = [&](std::size_t k) -> Part {
    if (use_graph) return [&, k] { graphs[k].launch(stream); };
    return bodies[k];
  };
  const int warmup = sh.s.warmup;
  gate.run(r, [&] { sh.pilot[sr] = time_parts({part(0)}, 1, 3, stream); });
  int replays = 1;
  gate.run(r, [&] {
    replays = sh.replays();
    sh.step[sr] = time_parts({part(0)}, warmup, replays, stream);
  });
  gate.run(r, [&] { sh.phases[sr] = time_parts({part(1), part(2)}, warmup, replays, stream); });
  if (single) {
    gate.run(r, [&] { sh.single_step[sr] = time_parts({part(3)}, warmup, replays, stream); });
    gate.run(r, [&] { sh.single_phases[sr] = time_parts({part(4), part(5)}, warmup, replays, stream); });
  }
  // Freed on this rank's device, by this thread.
  graphs.clear();
  rank.reset();
  if (stream) (void)cudaStreamDestroy(stream);
}

}  // namespace

CpRun run_cp_case(const BenchCase& c, const CpSettings& s, const CpComms& comms, CpReference& ref) {
  Shared sh(c, s, comms);
  CpRun run;
  run.ranks = sh.n;
  run.sharding = sh.sharding;
  std::vector<std::thread> threads;
  for (int r = 0; r < sh.n; ++r)
    threads.emplace_back([&sh, r] {
      try {
        rank_main(sh, r);
      } catch (const std::exception& e) {  // only outside the lockstep (cleanup)
        sh.gate.fail(r, e.what());
      }
    });
  for (std::thread& t : threads) t.join();
  (void)cudaSetDevice(0);
  run.error = sh.gate.error();
  if (!run.error.empty()) return run;

  run.graph = std::all_of(sh.graph_ok.begin(), sh.graph_ok.end(), [](int ok) { return ok != 0; });
  for (const std::string& n : sh.graph_note)
    if (!n.empty() && run.note.empty()) run.note = "timed without CUDA graphs: " + n;
  run.cp = {slowest_rank(sh.step, 0), slowest_rank(sh.phases, 0), slowest_rank(sh.phases, 1)};
  run.index_bytes = *std::max_element(sh.index_bytes.begin(), sh.index_bytes.end());
  run.device_bytes = *std::max_element(sh.device_bytes.begin(), sh.device_bytes.end());
  run.candidate_bytes = sh.candidate_bytes;
  run.partial_bytes = sh.partial_bytes;
  if (sh.n == 1) {
    run.has_single = true;
    run.single = {slowest_rank(sh.single_step, 0), slowest_rank(sh.single_phases, 0),
                  slowest_rank(sh.single_phases, 1)};
    ref.topk = std::move(sh.single_topk);
    ref.out = std::move(sh.single_out);
  }
  if (!ref.out.empty()) {
    run.topk_rows_differ = rows_differing(sh.topk, ref.topk, c.topk);
    run.rel_err = rel_frobenius_bf16(sh.out, ref.out);
  }
  return run;
}

}  // namespace msa::tool
