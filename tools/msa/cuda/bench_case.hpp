// One case of `msa bench`: builds its inputs on the device (rotated copies
// beyond L2), captures the attend or index run step (bench_case.cpp), or the
// layer step and each of its stages (bench_layer.cpp), in CUDA graphs and
// times the replays.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "bench_accounting.hpp"
#include "bench_topk.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

struct BenchSettings {
  int iters = 100;              // most timed replays per case
  int warmup = 5;               // untimed replays first (after one eager run)
  double budget_ms = 250.0;     // fewer replays for slow cases: about this much GPU time
  std::optional<TopkPattern> pattern;  // --pattern; none: each case's (case_pattern)
  std::uint64_t seed = 1;
  double l2_bytes = 50e6;
  double memory_budget = 40e9;  // device bytes for the rotated copies of one case
  cuda::AttentionTuning tuning;  // of the attention plans
  bool token_scales = false;  // fp8 caches: per-(token, head) scales instead of one per tensor
  // nvfp4 index caches: the index workspace sized to widen the prefill keys
  // ahead (cuda::index_workspace_bytes with the cache dtype); off: scores only.
  bool index_widen_ahead = true;
};

// The index workspace of a step of T tokens under the settings.
inline std::size_t index_workspace_bytes(const BenchSettings& s, std::int32_t T, std::int32_t H, std::int32_t max_blocks,
                                         DType index_dtype, std::int32_t prefills) {
  return cuda::index_workspace_bytes(T, H, max_blocks, index_dtype, s.index_widen_ahead ? prefills : 0);
}

// The stages of a layer case, in their order in the step.
enum class LayerStage : std::uint8_t { insert, index, attend };
inline constexpr int kLayerStages = 3;
inline constexpr const char* kLayerStageNames[kLayerStages] = {"insert", "index", "attend"};

// One stage of a layer case, captured and timed alone like the layer.
struct StageResult {
  TimeStats time;
  Traffic traffic;  // per replay, averaged over the copies
  bool graph = true;
};

struct BenchResult {
  BenchCase c;
  TimeStats time;  // layer cases: the whole layer step
  // Decode / verify cases: the read floor (read_floor.hpp), the gather of the
  // step's K / V blocks alone, timed like the case; samples == 0: not measured.
  TimeStats read_floor;
  // Pre-attention cases: the copy floor, a device-to-device copy of half the
  // step's bytes (it reads and writes as many as the step moves) between
  // rotated buffers, timed like the case; samples == 0: not measured.
  TimeStats copy_floor;
  Traffic traffic;          // per replay, averaged over the copies (layer: the stages' sum)
  // Layer cases: insert, index, attend (LayerStage order); the index query's
  // dtype; and how far the indexer's selections followed the index queries'
  // block groups (group_selection_fraction, -1 without groups).
  std::array<StageResult, kLayerStages> stages;
  DType iq_dtype = DType::bf16;
  double group_fraction = -1.0;
  int copies = 0;           // rotated input copies
  bool graph = true;        // replays were CUDA-graph launches (else direct calls)
  double device_bytes = 0;  // device memory the case allocated
  std::string note;         // e.g. why the replays are not graph launches
  std::string error;        // non-empty: the case did not run
};

BenchResult run_bench_case(const BenchCase& c, const BenchSettings& s, cuda::Stream stream);

}  // namespace msa::tool
