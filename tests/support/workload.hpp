// Synthesis of one engine step of one sparse layer, for tools and tests.
//
// A Workload owns host buffers for everything the three operations read and
// write: the paged KV cache (physical pages shuffled: every request's block
// table is a random, non-contiguous set of pages), the index cache with its own
// shuffled block table, the cached context already written through
// cpu::insert_kv / cpu::insert_index, the step's new K/V/index keys with their
// slot mappings (not yet inserted: that is the "insert" stage), queries and
// index queries, and the top-k, output and lse buffers (poisoned).
//
// Values: K, V and queries are unit-variance normals rounded to the source
// dtype. Index keys are a slowly varying per-block component plus per-token
// noise, and index queries drift slowly along the sequence, so neighbouring
// query tokens prefer mostly the same blocks, as in a real model.
//
// Everything is a deterministic function of the spec (seed included), whatever
// the thread count. The raw buffers are public so that a GPU path can copy them
// to the device and rebuild the views with the *_at() functions.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/config.hpp"
#include "msa/cpu.hpp"
#include "msa/dtype.hpp"
#include "msa/ops.hpp"

namespace msa {

// One request of the step: `context_len` tokens already cached, `query_len`
// new tokens. Both 0 make a padding request (seq_len 0).
struct RequestShape {
  std::int32_t query_len = 1;
  std::int32_t context_len = 0;
};

struct WorkloadSpec {
  ModelConfig model;
  DType kv_dtype = DType::bf16;                  // bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4
  Layout layout = Layout::hnd;                   // bf16/fp16/fp8 only (nvfp4 has one layout)
  ScaleMode fp8_scales = ScaleMode::per_tensor;  // fp8 only: per_tensor or per_token_head
  DType q_dtype = DType::bf16;                   // bf16, fp16, or fp8_e4m3 (output then bf16)
  DType index_dtype = DType::bf16;               // index cache: bf16, fp8_e4m3 or nvfp4
  // fp8_e4m3 index cache only: the indexer reads the index query cast to e4m3
  // (cpu::cast_index_query_e4m3, contract 3) instead of the src_dtype one.
  bool fp8_index_query = false;
  // Also keep a bf16 index cache of the same keys on the same pages (the "twin"),
  // so a low-precision index can be compared with the bf16 one.
  bool bf16_index_twin = false;
  std::vector<RequestShape> requests;            // batch order: decodes first
  std::int32_t decode_threshold = 1;             // see BatchSpec
  std::uint64_t seed = 0;
  // Unused pages mixed into each cache's pool; -1: about 1/8 of the used ones, plus 1.
  std::int64_t spare_pages = -1;
  // Main cache page stride (elements; bytes for nvfp4); 0 = compact pages. A
  // larger stride models layer- or block-outer packing.
  std::int64_t page_stride = 0;
  // Fill memory nobody may read (spare pages, the tail of each request's last
  // page, per-token scales of unused slots) and the outputs with NaN.
  bool poison = true;
  int num_threads = 0;  // 0: one per hardware thread
};

// Host memory a Workload of this spec allocates, computed from the spec alone
// (before allocating anything), in bytes.
struct WorkloadBytes {
  double kv_cache = 0;     // main cache, with its per-token scales
  double index_cache = 0;
  double step = 0;         // block tables, metadata, the step's inputs and outputs
  double scratch = 0;      // setup buffers, freed before the step runs
  double total() const { return kv_cache + index_cache + step + scratch; }
};
// Throws msa::Error on a spec the Workload would reject.
WorkloadBytes workload_bytes(const WorkloadSpec& spec);

// Called during setup with (what, done, total), e.g. ("cached context", 40960, 327680).
using WorkloadProgress = std::function<void(const char*, std::int64_t, std::int64_t)>;

class Workload {
 public:
  explicit Workload(WorkloadSpec spec, const WorkloadProgress& progress = {});
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;
  Workload(Workload&&) = default;
  Workload& operator=(Workload&&) = default;

  const WorkloadSpec& spec() const { return spec_; }
  const ModelConfig& model() const { return spec_.model; }
  const BatchMetadata& meta() const { return meta_; }
  StepView step() const { return meta_.view(); }
  std::int32_t num_tokens() const { return meta_.num_tokens; }
  std::int32_t num_requests() const { return meta_.num_requests; }
  // dtype of the new K/V, index keys and index queries: fp16 for an fp16 query, else bf16.
  DType src_dtype() const;
  // dtype of the output: the query's, bf16 for an fp8 query.
  DType out_dtype() const;
  cpu::Options cpu_options() const { return cpu::Options{spec_.num_threads, true}; }

  // ---- main KV cache ------------------------------------------------------------
  std::int64_t num_pages = 0;
  std::vector<std::uint8_t> kv_bytes;  // the allocation: cache_extent() elements (bytes for nvfp4)
  std::vector<float> k_scales, v_scales;  // per_token_head only: [num_pages * 128, num_kv_heads]
  float k_scale = 1.0f, v_scale = 1.0f;   // per-tensor fp8 scale or nvfp4 global scale
  std::int32_t max_blocks = 0;            // blocks of the longest request
  std::int64_t table_stride = 0;          // elements between block-table rows (> max_blocks)
  std::vector<std::int32_t> block_table;  // [num_requests, table_stride], -1 past each row's blocks

  // ---- index cache ---------------------------------------------------------------
  std::int64_t index_num_pages = 0;
  std::vector<std::uint8_t> index_bytes;        // [index_num_pages, index_page_bytes(index_dtype)]
  float index_scale = 1.0f;                     // nvfp4 index cache: its global scale
  std::vector<std::int32_t> index_block_table;  // [num_requests, table_stride], own shuffle
  std::vector<std::uint8_t> twin_index_bytes;   // bf16_index_twin: [index_num_pages, 128, 128] bf16

  // ---- the step ------------------------------------------------------------------
  std::vector<std::uint8_t> new_k;        // [num_tokens, num_kv_heads, 128] src_dtype
  std::vector<std::uint8_t> new_v;        // [num_tokens, num_kv_heads, 128] src_dtype
  std::vector<std::uint8_t> new_index_k;  // [num_tokens, 128] src_dtype
  std::vector<std::int64_t> slots;        // [num_tokens] main-cache slot of each new token
  std::vector<std::int64_t> index_slots;  // [num_tokens] index-cache slot of each new token
  std::vector<std::uint8_t> q;            // [num_tokens, num_q_heads, 128] q_dtype
  float q_scale = 1.0f;                   // dequant scale of an fp8 query
  std::vector<std::uint8_t> index_q;      // [num_tokens, num_kv_heads, 128] src_dtype
  std::vector<std::uint8_t> index_q_e4m3; // fp8_index_query: [num_tokens, num_kv_heads, 128] e4m3
  std::vector<std::int32_t> topk;         // [num_tokens, num_kv_heads, topk] written by index
  std::vector<std::int32_t> twin_topk;    // bf16_index_twin: the same, from the twin
  std::vector<std::uint8_t> out;          // [num_tokens, num_q_heads, 128] out_dtype
  std::vector<float> lse;                 // [num_tokens, num_q_heads]

  // Refills topk (with INT32_MIN), out and lse (with NaN) as before a run.
  void poison_outputs();

  // ---- views of the host buffers ---------------------------------------------------
  KVCacheView kv_view() { return kv_view_at(kv_bytes.data(), k_scales.data(), v_scales.data()); }
  IndexCacheView index_view() { return index_view_at(index_bytes.data()); }
  IndexCacheView twin_index_view() { return twin_index_view_at(twin_index_bytes.data()); }
  BlockTable table() const { return table_at(block_table.data()); }
  BlockTable index_table() const { return table_at(index_block_table.data()); }
  TopkView topk_view() {
    return TopkView::token_major(topk.data(), model().num_kv_heads, model().topk);
  }

  // The same views over copies of the buffers elsewhere (e.g. device memory).
  KVCacheView kv_view_at(void* base, float* k_scales_at, float* v_scales_at) const;
  IndexCacheView index_view_at(void* base) const;
  IndexCacheView twin_index_view_at(void* base) const;
  BlockTable table_at(const std::int32_t* data) const;

  // Arguments of the three stages over the host buffers.
  InsertKVArgs insert_kv_args() const;
  InsertIndexArgs insert_index_args() const;
  // The index query the indexer reads (index_q, or index_q_e4m3) and its dtype.
  IndexerArgs indexer_args();
  // The bf16 twin: the same step over twin_index_bytes with the src_dtype index
  // query, writing twin_topk. The step's keys go in with insert_index_args().
  IndexerArgs twin_indexer_args();
  AttentionArgs attention_args();

  // Physical page of request r's logical block b (main and index cache).
  std::int32_t page(std::int32_t r, std::int32_t b) const {
    return block_table[r * table_stride + b];
  }
  std::int32_t index_page(std::int32_t r, std::int32_t b) const {
    return index_block_table[r * table_stride + b];
  }

 private:
  void build_tables();
  void allocate_caches();
  void make_step_inputs();
  void insert_context(const WorkloadProgress& progress);

  WorkloadSpec spec_;
  BatchMetadata meta_;
};

}  // namespace msa
