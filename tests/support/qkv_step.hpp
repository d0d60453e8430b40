// A Workload's step as the fused QKV projection output, for pre-attention
// (msa/pre_attention.hpp): per token the query, K, V, index-query and
// index-key heads the workload generated (its q, new_k, new_v, index_q and
// new_index_k), each head at a random gain, in the workload's source dtype;
// random norm weights; the rope table of MiniMax-M3's theta up to the step's
// last position; the tokens' positions. Pre-attention over these arguments
// writes the workload's q and index_q buffers and inserts K, V and the index
// keys at its slots. Deterministic in the workload's seed.
#pragma once

#include <cstdint>
#include <vector>

#include "msa/pre_attention.hpp"
#include "workload.hpp"

namespace msa {

struct QkvStep {
  std::vector<std::uint8_t> qkv;        // [num_tokens, (nq + 3 * nkv + 1) * 128] src dtype
  std::vector<float> weights;           // [4, 128]: q, k, index q, index k (f32)
  std::vector<float> cos_sin;           // [max_position, 64] (f32)
  std::vector<std::int64_t> positions;  // [num_tokens] (0 for padding tokens)
  std::int64_t max_position = 0;

  // The arguments over these buffers and the workload's (host memory): q into
  // w.q (q_dtype, with w.q_scale), index q into the buffer the workload's
  // indexer reads (w.index_q_e4m3 in e4m3 with fp8_index_query, else
  // w.index_q in the src dtype), slots w.slots and w.index_slots.
  PreAttentionArgs args(Workload& w) const;
  // The same for the bf16 index twin (bf16_index_twin): index q into w.index_q
  // in the src dtype; call it with w.twin_index_view() (K, V and q come out as
  // with args()).
  PreAttentionArgs twin_args(Workload& w) const;
};

// Also sets w.q_scale for an fp8 query: the step's q comes out of the norm, so
// the scale leaves room above the workload's (1.5x).
QkvStep make_qkv_step(Workload& w, double rope_theta = kM3RopeTheta);

// Bytes a QkvStep of a workload of this spec holds, from the spec alone.
double qkv_step_bytes(const WorkloadSpec& spec);

}  // namespace msa
