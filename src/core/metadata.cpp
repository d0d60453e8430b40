// Batch metadata of one engine step (contract 7), derived from per-request
// query and sequence lengths. Classification (docs/DESIGN.md):
//  - seq_len 0 marks a padding request: its rows have position -1;
//  - a request with 0 < query_len <= decode_threshold is a decode; decodes come
//    first and share one query length;
//  - every other request is a prefill, including query_len 0 (a request with
//    context but no new token this step: it owns no rows).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "msa/batch.hpp"
#include "msa/error.hpp"

namespace msa {

namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

void check_spec(const BatchSpec& spec) {
  MSA_CHECK(spec.query_lens.size() == spec.seq_lens.size(), "query_lens has ",
            spec.query_lens.size(), " entries but seq_lens has ", spec.seq_lens.size());
  MSA_CHECK(std::int64_t(spec.query_lens.size()) < kInt32Max, "the batch has ",
            spec.query_lens.size(), " requests, more than int32 holds");
  MSA_CHECK(spec.decode_threshold >= 0, "decode_threshold = ", spec.decode_threshold,
            " is negative");
  const std::int32_t n = std::int32_t(spec.query_lens.size());
  for (std::int32_t r = 0; r < n; ++r) {
    const std::int32_t q = spec.query_lens[r];
    const std::int32_t s = spec.seq_lens[r];
    MSA_CHECK(q >= 0, "query_lens[", r, "] = ", q, " is negative");
    MSA_CHECK(s >= 0, "seq_lens[", r, "] = ", s, " is negative");
    MSA_CHECK(s == 0 || s >= q, "seq_lens[", r, "] = ", s, " is below query_lens[", r, "] = ", q,
              " (seq_len counts the new tokens; 0 marks a padding request)");
  }
}

bool is_decode(const BatchSpec& spec, std::int32_t r) {
  return spec.query_lens[r] > 0 && spec.query_lens[r] <= spec.decode_threshold;
}

}  // namespace

StepView BatchMetadata::view() const {
  StepView v;
  v.num_requests = num_requests;
  v.num_tokens = num_tokens;
  v.num_decodes = num_decodes;
  v.num_decode_tokens = num_decode_tokens;
  v.decode_query_len = decode_query_len;
  v.query_start = query_start.data();
  v.seq_lens = seq_lens.data();
  v.token_request = token_request.data();
  return v;
}

BatchMetadata build_metadata(const BatchSpec& spec) {
  check_spec(spec);
  BatchMetadata m;
  const std::int32_t n = std::int32_t(spec.query_lens.size());
  m.num_requests = n;

  // Decodes: the leading run of requests with 0 < query_len <= threshold.
  while (m.num_decodes < n && is_decode(spec, m.num_decodes)) ++m.num_decodes;
  for (std::int32_t r = m.num_decodes; r < n; ++r) {
    MSA_CHECK(!is_decode(spec, r), "request ", r, " is a decode (query_lens[", r,
              "] = ", spec.query_lens[r], " <= decode_threshold = ", spec.decode_threshold,
              ") after prefill request ", m.num_decodes, "; decodes must come first");
  }
  if (m.num_decodes > 0) m.decode_query_len = spec.query_lens[0];
  for (std::int32_t r = 1; r < m.num_decodes; ++r) {
    MSA_CHECK(spec.query_lens[r] == m.decode_query_len, "query_lens[", r, "] = ",
              spec.query_lens[r], " but decode request 0 has query length ", m.decode_query_len,
              "; decodes must share one query length");
  }
  m.num_prefills = n - m.num_decodes;

  // Per-request starts, in int64 first so that overflow is caught.
  m.query_start.assign(std::size_t(n) + 1, 0);
  std::int64_t tokens = 0;
  for (std::int32_t r = 0; r < n; ++r) {
    tokens += spec.query_lens[r];
    MSA_CHECK(tokens <= kInt32Max, "the batch has ", tokens, " tokens up to request ", r,
              ", more than int32 holds");
    m.query_start[r + 1] = std::int32_t(tokens);
  }
  m.num_tokens = std::int32_t(tokens);
  m.num_decode_tokens = m.query_start[m.num_decodes];
  m.num_prefill_tokens = m.num_tokens - m.num_decode_tokens;

  m.seq_lens = spec.seq_lens;
  m.context_lens.resize(n);
  for (std::int32_t r = 0; r < n; ++r) {
    m.context_lens[r] = m.seq_lens[r] == 0 ? 0 : m.seq_lens[r] - spec.query_lens[r];
  }

  // Per token: request and absolute position (-1 for padding rows).
  m.token_request.resize(m.num_tokens);
  m.token_position.resize(m.num_tokens);
  for (std::int32_t r = 0; r < n; ++r) {
    for (std::int32_t i = 0; i < spec.query_lens[r]; ++i) {
      const std::int32_t t = m.query_start[r] + i;
      m.token_request[t] = r;
      m.token_position[t] = m.seq_lens[r] == 0 ? -1 : m.context_lens[r] + i;
    }
  }

  // Prefill part, rebased to the first prefill.
  m.cu_seqlens_q.assign(std::size_t(m.num_prefills) + 1, 0);
  m.cu_seqlens_k.assign(std::size_t(m.num_prefills) + 1, 0);
  m.prefill_seq_lens.resize(m.num_prefills);
  m.prefill_context_lens.resize(m.num_prefills);
  std::int64_t keys = 0;
  for (std::int32_t i = 0; i < m.num_prefills; ++i) {
    const std::int32_t r = m.num_decodes + i;
    m.cu_seqlens_q[i + 1] = m.query_start[r + 1] - m.num_decode_tokens;
    keys += m.seq_lens[r];
    MSA_CHECK(keys <= kInt32Max, "the prefills hold ", keys, " keys up to request ", r,
              ", more than int32 holds (cu_seqlens_k)");
    m.cu_seqlens_k[i + 1] = std::int32_t(keys);
    m.prefill_seq_lens[i] = m.seq_lens[r];
    m.prefill_context_lens[i] = m.context_lens[r];
    m.max_query_len = std::max(m.max_query_len, spec.query_lens[r]);
    m.max_seq_len = std::max(m.max_seq_len, m.seq_lens[r]);
    m.total_kv_blocks += (std::int64_t(m.seq_lens[r]) + kBlockSize - 1) / kBlockSize;
  }
  return m;
}

}  // namespace msa
