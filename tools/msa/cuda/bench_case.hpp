// One case of `msa bench`: builds its inputs on the device (rotated copies
// beyond L2), captures the attend (or index) run step in CUDA graphs and times
// the replays (bench_case.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "bench_accounting.hpp"
#include "bench_topk.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

struct BenchSettings {
  int iters = 100;              // most timed replays per case
  int warmup = 5;               // untimed replays first (after one eager run)
  double budget_ms = 250.0;     // fewer replays for slow cases: about this much GPU time
  TopkPattern pattern = TopkPattern::random;
  std::uint64_t seed = 1;
  double l2_bytes = 50e6;
  double memory_budget = 40e9;  // device bytes for the rotated copies of one case
  cuda::AttentionTuning tuning;  // of the attention plans
  bool token_scales = false;  // fp8 caches: per-(token, head) scales instead of one per tensor
};

struct BenchResult {
  BenchCase c;
  TimeStats time;
  // Decode / verify cases: the read floor (read_floor.hpp), the gather of the
  // step's K / V blocks alone, timed like the case; samples == 0: not measured.
  TimeStats read_floor;
  Traffic traffic;          // per replay, averaged over the copies
  int copies = 0;           // rotated input copies
  bool graph = true;        // replays were CUDA-graph launches (else direct calls)
  double device_bytes = 0;  // device memory the case allocated
  std::string note;         // e.g. why the replays are not graph launches
  std::string error;        // non-empty: the case did not run
};

BenchResult run_bench_case(const BenchCase& c, const BenchSettings& s, cuda::Stream stream);

}  // namespace msa::tool
