// Arguments of the operations of one sparse layer: insert, index, attend.
// The same plain structs drive the CPU engine and the CUDA backend; pointers
// live in the memory of the backend that runs the operation.
#pragma once

#include <cstdint>

#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"

namespace msa {

// A top-k buffer: entry (t, h, k) at data[t*token_stride + h*head_stride + k].
// Token-major [num_tokens, num_kv_heads, topk] by default; a [kv_head, token,
// topk] strided view is the same struct with other strides.
struct TopkView {
  std::int32_t* data = nullptr;
  std::int32_t topk = 0;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;

  MSA_HD std::int32_t* row(std::int64_t t, std::int64_t h) const {
    return data + t * token_stride + h * head_stride;
  }
  static TopkView token_major(std::int32_t* data, int num_kv_heads, int topk) {
    return TopkView{data, topk, std::int64_t(num_kv_heads) * topk, topk};
  }
};

// K/V insert: token i's K and V go to slot slots[i] = page * 128 + offset.
struct InsertKVArgs {
  const void* k = nullptr;          // [num_tokens, num_kv_heads, 128], src_dtype
  const void* v = nullptr;          // [num_tokens, num_kv_heads, 128], src_dtype
  DType src_dtype = DType::bf16;    // bf16 or fp16
  const std::int64_t* slots = nullptr;  // [num_tokens]; negative = skip (padding)
  std::int64_t num_tokens = 0;
};

// Index-key insert: one 128-vector per token into the index cache.
struct InsertIndexArgs {
  const void* index_k = nullptr;    // [num_tokens, 128], src_dtype
  DType src_dtype = DType::bf16;    // bf16 or fp16
  const std::int64_t* slots = nullptr;  // [num_tokens]; negative = skip
  std::int64_t num_tokens = 0;
};

// Indexer: block scores and top-k selection (contract 5).
struct IndexerArgs {
  const void* index_q = nullptr;    // [num_tokens, num_kv_heads, 128], iq_dtype
  // bf16 or fp16; or fp8_e4m3 with an fp8_e4m3 cache (the query cast like the
  // keys: plain saturating), which the GPU scores on fp8 tensor cores.
  DType iq_dtype = DType::bf16;
  std::int32_t num_kv_heads = 0;
  std::int32_t init_blocks = 0;
  std::int32_t local_blocks = 1;
  IndexCacheView cache;
  BlockTable block_table;           // the index cache's own block table
  TopkView out;                     // [num_tokens, num_kv_heads, topk] written
};

// Sparse attention (contract 6).
struct AttentionArgs {
  const void* q = nullptr;          // [num_tokens, num_q_heads, 128], q_dtype
  DType q_dtype = DType::bf16;      // bf16, fp16, or fp8_e4m3 with q_scale
  float q_scale = 1.0f;             // dequant scale of an fp8 query
  void* out = nullptr;              // [num_tokens, num_q_heads, 128], out_dtype
  DType out_dtype = DType::bf16;    // bf16 or fp16 (the query dtype, or chosen for fp8 q)
  float* lse = nullptr;             // [num_tokens, num_q_heads] natural-log lse; optional
  std::int32_t num_q_heads = 0;
  float softmax_scale = 0.08838834764831845f;
  TopkView topk;                    // [num_tokens, num_kv_heads, topk] read
  KVCacheView cache;
  BlockTable block_table;
};

}  // namespace msa
