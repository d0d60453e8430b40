// The multi-GPU driver of `msa bench-cp` (bench_cp_ranks.cpp): NCCL
// communicators, one host thread per rank (GPU r is rank r), the timed
// replays and the comparison with the single-GPU result.
//
// Every rank builds its share of the case (CpRank), runs the step once eagerly
// (the result is compared with N = 1), captures the step, its index half and
// its attend half in CUDA graphs (NCCL calls included; if any rank fails to
// capture, every rank replays direct calls instead), and times them with CUDA
// events on its own device. A replay's time is the largest over the ranks; the
// report is the median of the replays. The ranks go through the same steps in
// lockstep, with a host barrier after each: if one rank fails, the others
// stop too instead of waiting in a collective. With one rank the single-GPU
// path (cuda::index + cuda::attend on the same caches) is timed as well.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_accounting.hpp"
#include "bench_cp_case.hpp"

namespace msa::tool {

// Whether this build exchanges over NCCL (MSA_HAVE_NCCL), and its version
// ("" without NCCL).
bool have_nccl();
std::string nccl_version();

// One NCCL communicator per rank over devices 0..n-1 (ncclCommInitAll, with
// NCCL_NVLS_ENABLE=0 set first: NVLink multicast stays off). Without NCCL only
// n = 1 is possible, with a null communicator.
class CpComms {
 public:
  explicit CpComms(int n);
  ~CpComms();
  CpComms(const CpComms&) = delete;
  CpComms& operator=(const CpComms&) = delete;

  int size() const { return int(comms_.size()); }
  void* comm(int rank) const { return comms_[std::size_t(rank)]; }  // ncclComm_t or null

 private:
  std::vector<void*> comms_;
};

struct CpSettings {
  int iters = 50;            // most timed replays
  int warmup = 5;            // untimed replays before each timed pass
  double budget_ms = 250.0;  // fewer replays (at least 10) when a step is slower than this budget / iters
  std::uint64_t seed = 1;
  bool graph = true;         // replay CUDA graphs (else direct calls)
  int run_blocks = 0;        // 0 round-robin; > 0 runs of that many blocks; < 0 even runs
  bool propose_from_scores = false;  // propose by a selection over the scores, not from the indexer's top-k
  cuda::cp::PartialMerge merge = cuda::cp::PartialMerge::gather;  // how the partial results are merged
};

// The step and its two halves; each the median over replays of the largest
// time over the ranks.
struct CpTimes {
  TimeStats step, index, attend;
};

// The single-GPU result of a case (taken at N = 1) that N > 1 is compared with.
struct CpReference {
  std::vector<std::int32_t> topk;  // [num_tokens, H, topk]
  std::vector<std::uint16_t> out;  // [num_tokens, num_q_heads, 128] bf16
};

struct CpRun {
  int ranks = 1;
  cp::Sharding sharding;
  CpTimes cp;
  bool has_single = false;  // one rank: `single` holds the single-GPU path
  CpTimes single;
  bool graph = true;        // the replays were CUDA-graph launches
  std::string note;         // why not, if not
  std::string error;        // non-empty: the run failed (first failing rank)
  double index_bytes = 0;      // largest over the ranks: index-cache bytes of its owned blocks
  double candidate_bytes = 0;  // per rank, sent in the candidate all-gather
  double partial_bytes = 0;    // per rank, sent in the partial all-gather
  double device_bytes = 0;     // largest over the ranks
  // Rank 0's merged result against the reference: rows (token, KV head) whose
  // top-k differs, and the relative Frobenius error of the output; -1 when
  // there was no reference to compare with.
  std::int64_t topk_rows_differ = -1;
  double rel_err = -1;
};

// Runs the case on comms.size() ranks. With one rank it also times the
// single-GPU path and sets `ref` to its result; with more it compares rank 0's
// result with `ref` (when it has one).
CpRun run_cp_case(const BenchCase& c, const CpSettings& s, const CpComms& comms, CpReference& ref);

}  // namespace msa::tool
