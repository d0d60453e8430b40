// The CUDA backend (sm_90a). Host-callable; no CUDA headers: a stream is passed
// as void* (a cudaStream_t, nullptr = the default stream). Every pointer inside
// the argument structs is a device pointer.
//
// Plan/run: the *plan* functions do host work from host metadata and enqueue
// the copies of their results into caller-owned device workspace; the *run*
// functions allocate nothing and never synchronize the host, so a decode step
// can be captured once in a CUDA graph and replayed with new top-k lists,
// sequence lengths, block tables and queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/cuda_schedule.hpp"
#include "msa/ops.hpp"
#include "msa/pre_attention.hpp"

namespace msa::cuda {

using Stream = void*;

// Caller-owned device scratch. Every GPU operation that needs scratch says how
// many bytes with its *_workspace_bytes function and takes them as a
// Workspace after its arguments; none allocates. 16-byte aligned (cudaMalloc's
// 256-byte alignment is enough).
struct Workspace {
  void* data = nullptr;  // device memory
  std::size_t bytes = 0;
};

// Usable CUDA devices; 0 when there is no driver or device (never throws).
int device_count();

// ---- device-side index checks (contract 8) ----------------------------------
// Kernels never read or write out of bounds whatever the indices hold: a bad
// top-k id, block-table entry or slot is skipped. When a DeviceCheck buffer is
// given, the first bad entry is also recorded there, and read_check() turns it
// into words (it synchronizes the stream: tools and tests call it, production
// code may skip it).
struct DeviceCheck {
  std::int64_t* buffer = nullptr;  // [8] device memory, zeroed by reset_check
};
void reset_check(const DeviceCheck& check, Stream stream);
// Throws msa::Error describing the first recorded bad entry, if any.
void read_check(const DeviceCheck& check, Stream stream);

// ---- the step on the device -------------------------------------------------------
// The kernels read a step's arrays (query_start, seq_lens, token_request) from
// device memory: upload_step copies a BatchMetadata's into a workspace of
// step_workspace_bytes() and returns the StepView over them. The copies are
// enqueued on `stream` from the host vectors (staged before the call returns,
// so `meta` may change afterwards); not for graph capture: upload each step
// before replaying its graph, into the same workspace.
std::size_t step_workspace_bytes(const BatchMetadata& meta);
StepView upload_step(const BatchMetadata& meta, const Workspace& workspace, Stream stream);

// ---- insert --------------------------------------------------------------------
void insert_kv(const KVCacheView& cache, const InsertKVArgs& args, Stream stream,
               const DeviceCheck& check = {});
void insert_index(const IndexCacheView& cache, const InsertIndexArgs& args, Stream stream,
                  const DeviceCheck& check = {});

// ---- pre-attention ---------------------------------------------------------------
// msa/pre_attention.hpp, bit-identical to cpu::pre_attention: one pass over qkv,
// 16 lanes per (token, head). Allocates nothing and never synchronizes (safe
// to capture in a CUDA graph). Device data is not read on the host: a
// position outside the cos/sin table skips its token whole, a slot beyond its
// cache skips that store, and both are recorded in the DeviceCheck.
void pre_attention(const KVCacheView& cache, const IndexCacheView& index_cache,
                   const PreAttentionArgs& args, Stream stream, const DeviceCheck& check = {});

// ---- indexer -------------------------------------------------------------------
// Bytes of scratch that index() needs: the block scores
// [num_tokens, num_kv_heads, max_blocks] fp32.
std::size_t index_workspace_bytes(std::int32_t num_tokens, std::int32_t num_kv_heads,
                                  std::int32_t max_blocks);
// The same, plus for an nvfp4 index cache the room to widen the keys of up to
// num_prefill_requests prefill requests once a step (max_blocks blocks of
// 32 KB each): index() then scores steps whose prefill requests average 2048
// rows (tokens x KV heads) or more from 16-bit keys widened once, instead of
// widening every page in every tile that scores it. Other dtypes need no more.
std::size_t index_workspace_bytes(std::int32_t num_tokens, std::int32_t num_kv_heads, std::int32_t max_blocks,
                                  DType cache_dtype, std::int32_t num_prefill_requests);
// Block scores then top-k, for every token of the step. `max_blocks` bounds
// ceil(seq_len / 128) over the step's requests. The scores stay at the start of
// the workspace afterwards ([num_tokens, num_kv_heads, max_blocks] fp32, -inf
// where not eligible), so tests can feed the very same scores to the CPU
// selection. index_q, the index cache base and its page stride in bytes must be
// 16-byte aligned.
void index(const StepView& step, const IndexerArgs& args, std::int32_t max_blocks, const Workspace& workspace,
           Stream stream, const DeviceCheck& check = {});
// Selection alone, from given scores [num_tokens, num_kv_heads, max_blocks].
void select_topk(const StepView& step, const float* scores, std::int32_t max_blocks,
                 const IndexerArgs& args, Stream stream);

// ---- k2q: the key-major inversion of the top-k lists (contract 7) ---------------
// The plan of msa::build_k2q (include/msa/k2q.hpp) built on the device, with no
// host round trip: for each KV head h and (request r, block b) a row
// h * num_rows + row_start[r] + b listing, ascending, the tokens that selected
// b, with each edge's slot (the column k of topk[t, h, k]). Deterministic (a
// stable sort of the edges by row). A token's valid entries are the prefix
// before its first -1; an id that is not eligible (> p / 128, or past the
// request's blocks) is skipped and recorded in the DeviceCheck, and a repeat of
// an earlier entry of the same list counts once (msa::build_k2q throws on both).
struct K2QDevicePlan {
  std::int64_t* offsets = nullptr;  // [num_kv_heads * num_rows + 1] CSR offsets; the last is nnz
  std::int32_t* tokens = nullptr;   // [num_tokens * num_kv_heads * topk] (first nnz used)
  std::int32_t* slots = nullptr;    // [num_tokens * num_kv_heads * topk] (first nnz used)
  std::int32_t* counts = nullptr;   // [num_tokens, num_kv_heads] edges placed per list
};
// Device scratch that build_k2q needs; num_rows = sum over requests of
// ceil(seq_len / 128) (BatchMetadata::num_blocks), the rows of one KV head.
std::size_t k2q_workspace_bytes(std::int32_t num_tokens, std::int32_t num_requests, int num_kv_heads, int topk,
                                std::int64_t num_rows);
// Builds the plan for every token of the step. The device seq_lens must give
// num_rows rows (entries whose row would fall past them are skipped and
// recorded). Allocates nothing, never synchronizes the host.
void build_k2q(const StepView& step, const TopkView& topk, int num_kv_heads, std::int64_t num_rows,
               const K2QDevicePlan& plan, void* workspace, std::size_t workspace_bytes, Stream stream,
               const DeviceCheck& check = {});

// ---- sparse attention ----------------------------------------------------------
// plan_attention turns the step's metadata, the problem (read from the
// arguments' plain fields) and the tuning into a schedule (msa/cuda_schedule.hpp):
// which kernel runs each class of rows, how rows and tiles split, whether an
// fp8 / nvfp4 step widens its blocks ahead, and where each piece lives in the
// caller's workspace. attend() runs that schedule as it is.

// A plan: its schedule and the caller's workspace.
struct AttentionPlan {
  AttentionSchedule schedule;
  Workspace workspace;

  // Whether this plan still serves a step: the same problem and the schedule
  // plan_attention would make for `meta` now (on this device, with this
  // plan's tuning), within this workspace; else `why` says what differs. A
  // decode-only schedule depends only on the problem, the tuning and the
  // token counts; one with prefill rows also on the request count, and when it
  // may run key-major or widens its blocks, on the requests' query and
  // sequence lengths. While this holds, a captured graph of attend() may be
  // replayed with new top-k lists, sequence lengths, block tables, queries and
  // cache contents (the device reads all of them on every replay).
  bool valid_for(const BatchMetadata& meta, const AttentionArgs& args, std::string* why = nullptr) const;
};

// Bytes of workspace the plan for this step needs. Only the plain fields of
// `args` are read (num_q_heads, topk.topk, q_dtype, out_dtype, cache.dtype,
// cache.num_kv_heads and cache.scale_mode); its pointers may be null.
std::size_t attention_workspace_bytes(const BatchMetadata& meta, const AttentionArgs& args,
                                      const AttentionTuning& tuning = {});
// Makes the schedule, lays out the workspace and enqueues the zeroing of its
// split counters on `stream` (plan and attend must be ordered on one stream,
// and two concurrent attends must not share a workspace). Throws msa::Error
// naming the field when the problem is unsupported, the tuning out of range
// or the workspace too small.
AttentionPlan plan_attention(const BatchMetadata& meta, const AttentionArgs& args, const Workspace& workspace,
                             Stream stream, const AttentionTuning& tuning = {});
// Runs the attention of every token of the step as the plan says. Allocates
// nothing, never synchronizes the host; safe to capture in a CUDA graph.
// Throws msa::Error when the step or the arguments are not those of the plan
// (AttentionPlan::valid_for) or are malformed.
void attend(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args, Stream stream,
            const DeviceCheck& check = {});

}  // namespace msa::cuda
