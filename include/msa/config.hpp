// Model-level numbers of one sparse attention layer, per tensor-parallel rank.
#pragma once

#include <string>

#include "msa/common.hpp"

namespace msa {

struct ModelConfig {
  int num_q_heads = 16;   // query heads on this rank
  int num_kv_heads = 1;   // KV heads on this rank (also the number of index heads)
  int head_dim = kHeadDim;
  int block_size = kBlockSize;  // tokens per sparse block == tokens per KV page
  int topk = 16;          // selected blocks per (query token, KV head)
  int init_blocks = 0;    // blocks [0, init_blocks) are always selected
  int local_blocks = 1;   // the last `local_blocks` eligible blocks are always selected
  float softmax_scale = 0.08838834764831845f;  // 1/sqrt(128)

  int group() const { return num_q_heads / num_kv_heads; }
  // Throws msa::Error naming the first field that is out of range.
  void validate() const;
  std::string describe() const;

  // MiniMax-M3 per-rank shapes: 64 query / 4 KV heads in the whole model;
  // TP1 64/4, TP2 32/2, TP4 16/1, TP8 8/1 (the one KV head is replicated).
  static ModelConfig minimax_m3(int tp = 1);
};

}  // namespace msa
