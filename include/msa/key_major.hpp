// Key-major (k2q) sparse attention on the CPU: the reference of the planned GPU
// key-major prefill (docs/DESIGN.md). Same result as cpu::attend, computed
// the other way round:
//   pass 1: for every plan row (KV head h, request r, block b) the block's K/V is
//           converted once and serves every edge (token t, slot k) of the row:
//           for each query head q of h's group, the softmax over the block's keys
//           that t sees (j <= p, j < seq_len) gives a normalized partial output
//           and its natural-log lse (0 and -inf when t sees none of them);
//   pass 2: per (token, query head), the valid slots (plan.counts) are merged
//           with lse weights into args.out (out_dtype) and args.lse.
#pragma once

#include <cstddef>
#include <cstdint>

#include "msa/batch.hpp"
#include "msa/cpu.hpp"
#include "msa/k2q.hpp"
#include "msa/ops.hpp"

namespace msa::cpu {

// Floats of partial_out; partial_lse holds this / 128.
std::size_t key_major_partial_floats(std::int32_t num_tokens, std::int32_t num_q_heads,
                                     std::int32_t topk);

// `plan` must be build_k2q(step, args.topk, num_kv_heads, token_begin, token_end);
// only args.topk.topk is used (its entries are not read). Tokens outside
// [token_begin, token_end) (token_end -1: all tokens) are left untouched in out,
// lse and the partial buffers; partial slots k >= counts are not written.
//   partial_out: [num_tokens, num_q_heads, topk, 128] fp32 scratch
//   partial_lse: [num_tokens, num_q_heads, topk] fp32 scratch
void attend_key_major(const StepView& step, const AttentionArgs& args, const K2QPlan& plan,
                      float* partial_out, float* partial_lse, const Options& opt = {},
                      std::int32_t token_begin = 0, std::int32_t token_end = -1);

}  // namespace msa::cpu
