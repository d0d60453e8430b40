#include "msa/config.hpp"

#include <cmath>
#include <cstdint>

#include "msa/error.hpp"

namespace msa {

void ModelConfig::validate() const {
  MSA_CHECK(head_dim == kHeadDim, "head_dim = ", head_dim, " is not supported (only 128)");
  MSA_CHECK(block_size == kBlockSize, "block_size = ", block_size, " is not supported (only 128)");
  MSA_CHECK(num_kv_heads >= 1, "num_kv_heads = ", num_kv_heads, " must be >= 1");
  MSA_CHECK(num_q_heads >= 1, "num_q_heads = ", num_q_heads, " must be >= 1");
  MSA_CHECK(num_q_heads % num_kv_heads == 0, "num_q_heads = ", num_q_heads,
            " is not divisible by num_kv_heads = ", num_kv_heads);
  MSA_CHECK(group() <= kMaxGroup, "GQA group = num_q_heads / num_kv_heads = ", group(),
            " exceeds ", kMaxGroup);
  MSA_CHECK(topk >= 1 && topk <= kMaxTopk, "topk = ", topk, " must be in [1, ", kMaxTopk, "]");
  MSA_CHECK(init_blocks >= 0, "init_blocks = ", init_blocks, " must be >= 0");
  MSA_CHECK(local_blocks >= 0, "local_blocks = ", local_blocks, " must be >= 0");
  MSA_CHECK(std::int64_t(init_blocks) + local_blocks <= topk, "init_blocks + local_blocks = ",
            std::int64_t(init_blocks) + local_blocks, " exceeds topk = ", topk);
  MSA_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0.0f, "softmax_scale = ", softmax_scale,
            " must be finite and positive");
}

std::string ModelConfig::describe() const {
  return detail::concat(num_q_heads, " query heads / ", num_kv_heads, " KV heads (group ", group(),
                        "), head_dim ", head_dim, ", block ", block_size, ", topk ", topk,
                        ", init ", init_blocks, ", local ", local_blocks);
}

ModelConfig ModelConfig::minimax_m3(int tp) {
  ModelConfig c;
  switch (tp) {
    case 1: c.num_q_heads = 64; c.num_kv_heads = 4; break;
    case 2: c.num_q_heads = 32; c.num_kv_heads = 2; break;
    case 4: c.num_q_heads = 16; c.num_kv_heads = 1; break;
    case 8: c.num_q_heads = 8; c.num_kv_heads = 1; break;
    default: fail("tp = ", tp, " is not a MiniMax-M3 tensor-parallel degree (expected 1, 2, 4 or 8)");
  }
  return c;
}

}  // namespace msa
