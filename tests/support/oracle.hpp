// The float64 oracle: dense masked attention with an explicit mask. It holds
// no sparse code (no blocks, no top-k, no pages): the tests and `msa check`
// build the mask from the contract's key set and the inputs from the cache
// reader, so nothing here shares code with the engines it judges.
#pragma once

#include <cstdint>
#include <vector>

namespace msa::ref {

// For each query row i: the keys j with mask[i, j] != 0 are visible;
//   s_j    = scale * dot(q[i], k[j])
//   out[i] = sum_j softmax(s)_j * v[j]
//   lse[i] = log(sum_j exp(s_j))            (natural log)
// A row with no visible key gets out 0 and lse -inf. NaN in the inputs of a
// visible key propagates to that row.
//   q: [nq, 128], k: [nk, 128], v: [nk, 128], mask: [nq, nk]
//   out: [nq, 128], lse: [nq] (lse may be null)
void masked_attention(const double* q, const double* k, const double* v, const std::uint8_t* mask,
                      std::int64_t nq, std::int64_t nk, double scale, double* out, double* lse);

// The same for a causal mask (key j visible to query i when j <= first_pos + i
// and j < nk): dense causal attention of nq queries at positions first_pos ...
//   q: [nq, 128], k, v: [nk, 128], out: [nq, 128], lse: [nq]
void causal_attention(const double* q, const double* k, const double* v, std::int64_t nq,
                      std::int64_t nk, std::int64_t first_pos, double scale, double* out,
                      double* lse);

}  // namespace msa::ref
