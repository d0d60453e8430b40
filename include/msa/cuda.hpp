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

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/ops.hpp"
#include "msa/pre_attention.hpp"

namespace msa::cuda {

using Stream = void*;

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
// Block scores then top-k, for every token of the step. `max_blocks` bounds
// ceil(seq_len / 128) over the step's requests. The scores stay at the start of
// the workspace afterwards ([num_tokens, num_kv_heads, max_blocks] fp32, -inf
// where not eligible), so tests can feed the very same scores to the CPU
// selection. index_q, the index cache base and its page stride in bytes must be
// 16-byte aligned.
void index(const StepView& step, const IndexerArgs& args, std::int32_t max_blocks, void* workspace,
           std::size_t workspace_bytes, Stream stream, const DeviceCheck& check = {});
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
// How the prefill rows of a step run when they run as token tiles on a bf16 /
// fp16 cache and the step has no decode rows (otherwise always query-major).
// Measured on the H200 (bench/RESULTS.md, 16K-token chunks): key-major is
// 1.1-1.6x faster than the token tiles when neighbouring tokens select
// unrelated blocks, and slower when they share them (what models produce).
enum class PrefillOrder : std::int32_t {
  query_major = 0,  // token tiles: T consecutive tokens and the union of their blocks
  key_major = 1,    // work items of one block and the tokens that selected it (the k2q plan), then a merge
  automatic = 2,    // steps of >= 8192 tokens build the k2q plan and the device picks per step
};

// What a plan depends on. A captured decode graph stays valid while these and
// the token count stay the same.
struct AttentionShape {
  std::int32_t num_q_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t topk = 16;
  DType q_dtype = DType::bf16;
  DType kv_dtype = DType::bf16;
  DType out_dtype = DType::bf16;
  PrefillOrder prefill_order = PrefillOrder::query_major;
  // Split-K factor of the decode / verify rows: 0 lets the plan choose (the
  // default); 1-16 forces it (tuning and experiments).
  std::int32_t decode_splits = 0;
  // Ways each prefill token tile's block union is split when the tiles run on
  // the persistent wgmma kernel (bf16 / fp16 caches, query-major): 0 lets the
  // plan choose (the default: steps with few tiles split every tile, steps of
  // one or two full rounds only the tiles of a last round at most half full);
  // 1-4 forces that many ways on every tile.
  std::int32_t tile_splits = 0;
  // fp8 caches: their scales are per (token, KV head) (KVCacheView k_scales /
  // v_scales) rather than per tensor. The row kernel then keeps the output's
  // MMA type, where it converts codes with more instructions, and the plan
  // splits decode rows as for nvfp4, and a prefill step's widened blocks
  // (widen_bytes) carry the blocks' scales. Any value gives correct results
  // (a per-token cache under a plan made without it widens on the fly).
  bool kv_token_scales = false;
  // fp8 / nvfp4 caches, prefill rows on the wgmma token tiles: the blocks the
  // step's tokens select are first widened into the workspace (bf16 / fp16,
  // once per (request, block, KV head): 64 KiB each, plus 1 KiB of scales with
  // kv_token_scales, which the tiles apply to fp32 scores and probabilities),
  // and the tiles run on the bf16 / fp16 kernel over them, instead of
  // widening each block in every tile that reads it. At most this many bytes
  // of widened blocks: -1 (the default) 1 GiB, 0 never. A step that may
  // select more blocks than fit (sum over prefill requests of min(blocks,
  // query_len x topk) x KV heads) counts them on the device and widens on the
  // fly when they do not fit.
  std::int64_t widen_bytes = -1;
};

// A plan: plain values and pointers into the caller's workspace.
struct AttentionPlan {
  AttentionShape shape;
  std::int32_t num_tokens = 0;
  std::int32_t num_decode_tokens = 0;
  std::int32_t decode_splits = 1;   // split-K factor over the selected blocks for decode rows
  std::int32_t prefill_splits = 1;  // the same for prefill rows
  void* workspace = nullptr;        // caller-owned device memory
  std::size_t workspace_bytes = 0;
  // fp32 partials of split rows (layout: src/cuda/attention/heuristics.hpp). They
  // cover the tokens of the classes that split, from token 0; the workspace also
  // holds per-row counters that plan_attention zeroes (a cudaMemsetAsync on its
  // stream) and the last split of a row resets, so plan and attend must be
  // ordered on one stream and two concurrent attends must not share a workspace.
  float* partial_out = nullptr;     // [partial_tokens, num_q_heads, max_splits, 128] fp32
  float* partial_lse = nullptr;     // [partial_tokens, num_q_heads, max_splits]
  // > 0: the step may run key-major (shape.prefill_order; a prefill-only step
  // on a bf16 / fp16 cache): the rows per KV head of its k2q plan,
  // sum over requests of ceil(seq_len / 128). The workspace then also holds the
  // k2q plan, the work items and 16-bit partials [num_tokens, num_q_heads, topk,
  // 128], and the device picks key-major or token tiles on each attend. Such a
  // plan depends on the requests' sequence lengths too (their block count).
  std::int64_t key_major_rows = 0;
  // > 1: prefill token tiles numbered from tile_split_from on (tile-major, KV
  // head fastest; 0: every tile) run as tile_splits work items each (a share
  // of the tile's blocks), writing 16-bit partials [num_tokens, num_q_heads,
  // tile_splits, 128] and their lse [num_tokens, num_q_heads, tile_splits] in
  // the workspace, merged per row by attend(). 1: no split (always with
  // key_major_rows > 0, and for caches that do not run the persistent tiles).
  std::int32_t tile_splits = 1;
  std::int64_t tile_split_from = 0;
  void* tile_partial_out = nullptr;
  float* tile_partial_lse = nullptr;
  // > 0: the step's fp8 / nvfp4 prefill tiles read blocks widened ahead
  // (AttentionShape::widen_bytes) from room for this many (block, KV head)
  // pages in the workspace, at widen_offset; widen_gated: the step may select
  // more, and the device then widens on the fly. The plan then depends on the
  // requests' sequence and query lengths too, and on which come first.
  std::int64_t widen_pages = 0;
  bool widen_gated = false;
  std::int32_t widen_first_request = 0;  // the step's first prefill request
  std::int32_t widen_requests = 0;       // its prefill requests
  std::int32_t widen_block_cap = 0;      // blocks of its longest prefill request
  std::size_t widen_offset = 0;          // bytes from the workspace's start
};

// Device bytes the plan for this step needs.
std::size_t attention_workspace_bytes(const BatchMetadata& meta, const AttentionShape& shape);
// Chooses split counts (a pure host heuristic) and lays out the workspace.
// Throws msa::Error if the workspace is too small or the shape is unsupported.
AttentionPlan plan_attention(const BatchMetadata& meta, const AttentionShape& shape, void* workspace,
                             std::size_t workspace_bytes, Stream stream);
// Runs the attention of every token of the step. Allocates nothing, never
// synchronizes the host; safe to capture in a CUDA graph.
void attend(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args,
            Stream stream, const DeviceCheck& check = {});

}  // namespace msa::cuda
