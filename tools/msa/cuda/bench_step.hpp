// Pieces the `msa bench` runners share (bench_case.cpp: attend and index
// cases; bench_layer.cpp: layer cases): the step's metadata on the device, the
// graph timing of a run step over rotated input copies, the KV cache pool and
// the attention plan of a case.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_accounting.hpp"
#include "bench_case.hpp"
#include "device_memory.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/cuda.hpp"
#include "msa/ops.hpp"

namespace msa::tool {

// The step's metadata on the host and its device copy.
struct Step {
  BatchMetadata meta;
  DeviceBuffer query_start, seq_lens, token_request;
  StepView view;
};
void make_step(const BenchCase& c, Step& st);

// Traffic averaged over rotated copies.
Traffic mean_traffic(const std::vector<Traffic>& copies);

struct TimedRun {
  TimeStats time;
  bool graph = true;  // replays were CUDA-graph launches (else direct calls)
  std::string note;   // why not, when not
};
// One eager call of direct(0) (loads the kernels, checks the arguments), then
// a CUDA graph of direct(i) per copy (direct calls if capture fails), a pilot
// of 3 replays that sizes the count (budget_ms), and the timed replays; replay
// i runs copy i % copies.
TimedRun time_graphs(const std::function<void(int)>& direct, int copies, const BenchSettings& s,
                     cuda::Stream stream);

// The scale mode of a case's KV cache: none (bf16 / fp16 / nvfp4), one per
// tensor, or per (token, KV head) with --kv-scales token.
ScaleMode kv_scale_mode(DType kv_dtype, const BenchSettings& s);

// A KV cache of `pages` compact pages (hnd; nvfp4 head-slot pages) filled on
// the device: random N(0, 1) values (fp8: 16 x N(0, 1) at scale 1/16; nvfp4:
// valid codes and group scales, global scales 1/64), and with per-token
// scales their own arrays (every scale about 0.0115).
struct KvPool {
  DeviceBuffer data, k_scales, v_scales;
  KVCacheView cache;
  std::int64_t block_bytes = 0;  // data bytes of one KV head's block (K + V), contiguous
  std::int64_t page_bytes = 0;   // block_bytes x KV heads
  double bytes() const { return double(data.bytes() + k_scales.bytes() + v_scales.bytes()); }
};
KvPool make_kv_pool(DType dtype, ScaleMode mode, std::int64_t pages, int num_kv_heads, std::uint64_t seed,
                    cuda::Stream stream);

// The attention plan of a case's step, made once (as an engine does per step)
// with the settings' knobs, and its workspace.
struct AttendPlan {
  DeviceBuffer workspace;
  cuda::AttentionPlan plan;
};
AttendPlan make_attend_plan(const BenchCase& c, const BenchSettings& s, const BatchMetadata& m, ScaleMode mode,
                            cuda::Stream stream);

// Attention arguments of one copy: bf16 query and output, no lse.
//   q, out: [num_tokens, num_q_heads, 128] bf16; topk: [num_tokens, num_kv_heads, topk];
//   table: [num_requests, max_blocks]
AttentionArgs make_attend_args(const BenchCase& c, const void* q, void* out, std::int32_t* topk,
                               const KVCacheView& cache, const std::int32_t* table, std::int32_t num_requests,
                               std::int32_t max_blocks);

}  // namespace msa::tool
