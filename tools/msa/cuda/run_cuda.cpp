#include "run_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "device_memory.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::tool {
namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("msa run (cuda): ", what, ": ", cudaGetErrorString(e));
}

// Times `fn` on `stream` with CUDA events (milliseconds -> seconds).
template <typename Fn>
double time_on(cudaStream_t stream, Fn&& fn) {
  cudaEvent_t a, b;
  cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
  cuda_ok(cudaEventRecord(a, stream), "cudaEventRecord");
  fn();
  cuda_ok(cudaEventRecord(b, stream), "cudaEventRecord");
  cuda_ok(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0.0f;
  cuda_ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return double(ms) * 1e-3;
}

// The plain fields of the step's attention arguments (what sizes its workspace).
AttentionArgs attention_args_of(const WorkloadSpec& spec) {
  AttentionArgs a;
  a.num_q_heads = spec.model.num_q_heads;
  a.topk.topk = spec.model.topk;
  a.q_dtype = spec.q_dtype;
  a.out_dtype = spec.q_dtype == DType::fp16 ? DType::fp16 : DType::bf16;
  a.cache.dtype = spec.kv_dtype;
  a.cache.num_kv_heads = spec.model.num_kv_heads;
  a.cache.scale_mode = !is_fp8(spec.kv_dtype) ? ScaleMode::none
                       : spec.fp8_scales == ScaleMode::per_token_head ? ScaleMode::per_token_head
                                                                      : ScaleMode::per_tensor;
  return a;
}

}  // namespace

double run_step_cuda_bytes(const WorkloadSpec& spec, bool qkv_input) {
  const WorkloadBytes b = workload_bytes(spec);
  BatchSpec batch;
  for (const RequestShape& r : spec.requests) {
    batch.query_lens.push_back(r.query_len);
    batch.seq_lens.push_back(r.query_len + r.context_len);
  }
  batch.decode_threshold = spec.decode_threshold;
  const BatchMetadata meta = build_metadata(batch);
  std::int32_t max_blocks = 0;
  for (std::int32_t r = 0; r < meta.num_requests; ++r) max_blocks = std::max(max_blocks, meta.num_blocks(r));
  return 2 * b.kv_cache + b.index_cache + b.step + (qkv_input ? qkv_step_bytes(spec) : 0.0) +
         double(cuda::index_workspace_bytes(meta.num_tokens, spec.model.num_kv_heads, max_blocks, spec.index_dtype,
                                            meta.num_prefills)) +
         double(cuda::attention_workspace_bytes(meta, attention_args_of(spec)));
}

double device_free_bytes() { return double(device_info().free_bytes); }

CudaStageTimes run_step_cuda(Workload& w, const QkvStep* qkv) {
  CudaStageTimes times;
  times.device = device_info().name;
  cudaStream_t stream;
  cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");
  const auto s = static_cast<cuda::Stream>(stream);
  const BatchMetadata& meta = w.meta();
  const ModelConfig& m = w.model();

  // ---- inputs to the device ------------------------------------------------------
  const DeviceBuffer kv_before = to_device(w.kv_bytes);  // the cache before the step's insert
  DeviceBuffer kv(w.kv_bytes.size());
  DeviceBuffer k_scales = to_device(w.k_scales), v_scales = to_device(w.v_scales);
  DeviceBuffer index_cache = to_device(w.index_bytes);
  const DeviceBuffer table = to_device(w.block_table), index_table = to_device(w.index_block_table);
  const DeviceBuffer new_k = to_device(w.new_k), new_v = to_device(w.new_v);
  const DeviceBuffer new_index_k = to_device(w.new_index_k);
  const DeviceBuffer slots = to_device(w.slots), index_slots = to_device(w.index_slots);
  DeviceBuffer q = to_device(w.q), index_q = to_device(w.index_q);
  // The index query the indexer reads: index_q, or its e4m3 cast for an fp8 index.
  DeviceBuffer index_q_e4m3 = to_device(w.index_q_e4m3);
  DeviceBuffer topk(w.topk.size() * sizeof(std::int32_t));
  DeviceBuffer out(w.out.size());
  DeviceBuffer lse(w.lse.size() * sizeof(float));
  DeviceBuffer step_ws(cuda::step_workspace_bytes(meta));
  DeviceBuffer check_buffer(8 * sizeof(std::int64_t));
  const cuda::DeviceCheck check{check_buffer.as<std::int64_t>()};

  const StepView step = cuda::upload_step(meta, {step_ws.get(), step_ws.bytes()}, s);

  const KVCacheView kv_view = w.kv_view_at(kv.get(), k_scales.as<float>(), v_scales.as<float>());
  InsertKVArgs insert_kv = w.insert_kv_args();
  insert_kv.k = new_k.get();
  insert_kv.v = new_v.get();
  insert_kv.slots = slots.as<std::int64_t>();
  InsertIndexArgs insert_index = w.insert_index_args();
  insert_index.index_k = new_index_k.get();
  insert_index.slots = index_slots.as<std::int64_t>();

  // Pre-attention: the qkv rows, weights, rope table and positions.
  DeviceBuffer d_qkv, weights, cos_sin, positions;
  PreAttentionArgs pre;
  if (qkv) {
    d_qkv = to_device(qkv->qkv);
    weights = to_device(qkv->weights);
    cos_sin = to_device(qkv->cos_sin);
    positions = to_device(qkv->positions);
    pre = qkv->args(w);
    pre.qkv = d_qkv.get();
    pre.positions = positions.as<std::int64_t>();
    pre.q_weight = weights.as<float>();
    pre.k_weight = weights.as<float>() + kHeadDim;
    pre.index_q_weight = weights.as<float>() + 2 * kHeadDim;
    pre.index_k_weight = weights.as<float>() + 3 * kHeadDim;
    pre.cos_sin = cos_sin.get();
    pre.q = q.get();
    pre.index_q = pre.index_q_dtype == DType::fp8_e4m3 ? index_q_e4m3.get() : index_q.get();
    pre.slots = slots.as<std::int64_t>();
    pre.index_slots = index_slots.as<std::int64_t>();
  }

  IndexerArgs ia = w.indexer_args();
  ia.index_q = ia.iq_dtype == DType::fp8_e4m3 ? index_q_e4m3.get() : index_q.get();
  ia.cache = w.index_view_at(index_cache.get());
  ia.block_table = w.table_at(index_table.as<std::int32_t>());
  ia.out.data = topk.as<std::int32_t>();
  const std::size_t index_ws_bytes =
      cuda::index_workspace_bytes(meta.num_tokens, m.num_kv_heads, w.max_blocks, ia.cache.dtype, meta.num_prefills);
  DeviceBuffer index_ws(index_ws_bytes);

  AttentionArgs aa = w.attention_args();
  aa.q = q.get();
  aa.out = out.get();
  aa.lse = lse.as<float>();
  aa.topk.data = topk.as<std::int32_t>();
  aa.cache = kv_view;
  aa.block_table = w.table_at(table.as<std::int32_t>());
  const std::size_t attend_ws_bytes = cuda::attention_workspace_bytes(meta, aa);
  DeviceBuffer attend_ws(attend_ws_bytes);

  cuda::reset_check(check, s);
  // ---- insert (warm-up, then timed on a fresh copy of the cache) ------------------
  for (int pass = 0; pass < 2; ++pass) {
    cuda_ok(cudaMemcpyAsync(kv.get(), kv_before.get(), w.kv_bytes.size(), cudaMemcpyDeviceToDevice,
                            stream),
            "cudaMemcpyAsync");
    times.insert_s = time_on(stream, [&] {
      if (qkv) {
        cuda::pre_attention(kv_view, ia.cache, pre, s, check);
      } else {
        cuda::insert_kv(kv_view, insert_kv, s, check);
        cuda::insert_index(ia.cache, insert_index, s, check);
      }
    });
  }
  // ---- index and attend (warm-up, then timed) --------------------------------------
  for (int pass = 0; pass < 2; ++pass)
    times.index_s = time_on(stream, [&] {
      cuda::index(step, ia, w.max_blocks, {index_ws.get(), index_ws_bytes}, s, check);
    });
  const cuda::AttentionPlan plan =
      cuda::plan_attention(meta, aa, {attend_ws.get(), attend_ws_bytes}, s);
  for (int pass = 0; pass < 2; ++pass)
    times.attend_s = time_on(stream, [&] { cuda::attend(plan, step, aa, s, check); });
  // ---- the bf16 index of the same keys, for the agreement (untimed) ----------------
  if (w.spec().bf16_index_twin) {
    DeviceBuffer twin_cache = to_device(w.twin_index_bytes);
    DeviceBuffer twin_topk(w.twin_topk.size() * sizeof(std::int32_t));
    IndexerArgs twin = w.twin_indexer_args();
    twin.index_q = index_q.get();  // the src_dtype index query
    twin.cache = w.twin_index_view_at(twin_cache.get());
    twin.block_table = ia.block_table;
    twin.out.data = twin_topk.as<std::int32_t>();
    if (qkv) {  // the same step again into the twin, its index query in the src dtype (K, V and q rewritten alike)
      PreAttentionArgs twin_pre = pre;
      twin_pre.index_q = index_q.get();
      twin_pre.index_q_dtype = w.src_dtype();
      cuda::pre_attention(kv_view, twin.cache, twin_pre, s, check);
    } else {
      cuda::insert_index(twin.cache, insert_index, s, check);
    }
    cuda::index(step, twin, w.max_blocks, {index_ws.get(), index_ws_bytes}, s, check);
    sync_stream(s);
    twin_topk.download(w.twin_topk.data(), w.twin_topk.size() * sizeof(std::int32_t));
  }
  cuda::read_check(check, s);
  sync_stream(s);

  // ---- results back to the host -----------------------------------------------------
  kv.download(w.kv_bytes.data(), w.kv_bytes.size());
  if (!w.k_scales.empty()) k_scales.download(w.k_scales.data(), w.k_scales.size() * sizeof(float));
  if (!w.v_scales.empty()) v_scales.download(w.v_scales.data(), w.v_scales.size() * sizeof(float));
  index_cache.download(w.index_bytes.data(), w.index_bytes.size());
  q.download(w.q.data(), w.q.size());
  index_q.download(w.index_q.data(), w.index_q.size());
  if (!w.index_q_e4m3.empty()) index_q_e4m3.download(w.index_q_e4m3.data(), w.index_q_e4m3.size());
  topk.download(w.topk.data(), w.topk.size() * sizeof(std::int32_t));
  out.download(w.out.data(), w.out.size());
  lse.download(w.lse.data(), w.lse.size() * sizeof(float));
  cudaStreamDestroy(stream);
  return times;
}

}  // namespace msa::tool
