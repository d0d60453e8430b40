// build_metadata and BatchMetadata::view (contract 7, docs/DESIGN.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "msa/batch.hpp"
#include "msa/error.hpp"

namespace {

using msa::BatchMetadata;
using msa::BatchSpec;
using V = std::vector<std::int32_t>;

BatchSpec spec(V query_lens, V seq_lens, std::int32_t threshold = 1) {
  BatchSpec s;
  s.query_lens = std::move(query_lens);
  s.seq_lens = std::move(seq_lens);
  s.decode_threshold = threshold;
  return s;
}

// The message of the msa::Error that build_metadata throws, or "<no error>".
std::string error_of(const BatchSpec& s) {
  try {
    msa::build_metadata(s);
  } catch (const msa::Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_ERROR(s, fragment)                                             \
  do {                                                                        \
    const std::string msg_ = error_of(s);                                     \
    EXPECT_NE(msg_.find(fragment), std::string::npos) << "message: " << msg_; \
  } while (0)

// Invariants every metadata must satisfy, checked from the spec alone.
void expect_consistent(const BatchSpec& s, const BatchMetadata& m) {
  const std::int32_t n = std::int32_t(s.query_lens.size());
  ASSERT_EQ(m.num_requests, n);
  ASSERT_EQ(m.query_start.size(), std::size_t(n) + 1);
  EXPECT_EQ(m.num_prefills, n - m.num_decodes);
  EXPECT_EQ(m.num_decode_tokens, m.num_decodes * m.decode_query_len);
  EXPECT_EQ(m.num_prefill_tokens, m.num_tokens - m.num_decode_tokens);
  ASSERT_EQ(m.token_request.size(), std::size_t(m.num_tokens));
  ASSERT_EQ(m.token_position.size(), std::size_t(m.num_tokens));
  EXPECT_EQ(m.seq_lens, s.seq_lens);
  std::int32_t t = 0;
  for (std::int32_t r = 0; r < n; ++r) {
    EXPECT_EQ(m.query_start[r], t) << "r=" << r;
    const bool decode = r < m.num_decodes;
    EXPECT_EQ(decode, s.query_lens[r] > 0 && s.query_lens[r] <= s.decode_threshold) << "r=" << r;
    const std::int32_t ctx = s.seq_lens[r] == 0 ? 0 : s.seq_lens[r] - s.query_lens[r];
    EXPECT_EQ(m.context_lens[r], ctx) << "r=" << r;
    for (std::int32_t i = 0; i < s.query_lens[r]; ++i, ++t) {
      EXPECT_EQ(m.token_request[t], r) << "t=" << t;
      EXPECT_EQ(m.token_position[t], s.seq_lens[r] == 0 ? -1 : ctx + i) << "t=" << t;
      EXPECT_EQ(m.view().position(t), m.token_position[t]) << "t=" << t;
    }
  }
  EXPECT_EQ(m.query_start[n], t);
  EXPECT_EQ(m.num_tokens, t);

  ASSERT_EQ(m.cu_seqlens_q.size(), std::size_t(m.num_prefills) + 1);
  ASSERT_EQ(m.cu_seqlens_k.size(), std::size_t(m.num_prefills) + 1);
  EXPECT_EQ(m.cu_seqlens_q[0], 0);
  EXPECT_EQ(m.cu_seqlens_k[0], 0);
  std::int32_t max_q = 0, max_s = 0;
  std::int64_t blocks = 0;
  for (std::int32_t i = 0; i < m.num_prefills; ++i) {
    const std::int32_t r = m.num_decodes + i;
    EXPECT_EQ(m.cu_seqlens_q[i + 1] - m.cu_seqlens_q[i], s.query_lens[r]);
    EXPECT_EQ(m.cu_seqlens_k[i + 1] - m.cu_seqlens_k[i], s.seq_lens[r]);
    EXPECT_EQ(m.prefill_seq_lens[i], s.seq_lens[r]);
    EXPECT_EQ(m.prefill_context_lens[i], m.context_lens[r]);
    max_q = std::max(max_q, s.query_lens[r]);
    max_s = std::max(max_s, s.seq_lens[r]);
    blocks += (s.seq_lens[r] + 127) / 128;
  }
  EXPECT_EQ(m.cu_seqlens_q[m.num_prefills], m.num_prefill_tokens);
  EXPECT_EQ(m.max_query_len, max_q);
  EXPECT_EQ(m.max_seq_len, max_s);
  EXPECT_EQ(m.total_kv_blocks, blocks);

  const msa::StepView v = m.view();
  EXPECT_EQ(v.num_requests, m.num_requests);
  EXPECT_EQ(v.num_tokens, m.num_tokens);
  EXPECT_EQ(v.num_decodes, m.num_decodes);
  EXPECT_EQ(v.num_decode_tokens, m.num_decode_tokens);
  EXPECT_EQ(v.decode_query_len, m.decode_query_len);
  EXPECT_EQ(v.query_start, m.query_start.data());
  EXPECT_EQ(v.seq_lens, m.seq_lens.data());
  EXPECT_NO_THROW(msa::check::step_data(v));
}

TEST(Metadata, Empty) {
  const BatchSpec s = spec({}, {});
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_tokens, 0);
  EXPECT_EQ(m.query_start, V{0});
  EXPECT_EQ(m.cu_seqlens_q, V{0});
}

TEST(Metadata, DecodeOnly) {
  const BatchSpec s = spec({1, 1, 1}, {5, 130, 1});
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 3);
  EXPECT_EQ(m.decode_query_len, 1);
  EXPECT_EQ(m.num_prefills, 0);
  EXPECT_EQ(m.token_position, (V{4, 129, 0}));
  EXPECT_EQ(m.total_kv_blocks, 0);  // prefills only
  EXPECT_EQ(m.max_seq_len, 0);
}

TEST(Metadata, PrefillOnly) {
  const BatchSpec s = spec({100, 7, 300}, {100, 200, 1000});
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 0);
  EXPECT_EQ(m.decode_query_len, 0);
  EXPECT_EQ(m.num_prefills, 3);
  EXPECT_EQ(m.context_lens, (V{0, 193, 700}));
  EXPECT_EQ(m.cu_seqlens_q, (V{0, 100, 107, 407}));
  EXPECT_EQ(m.cu_seqlens_k, (V{0, 100, 300, 1300}));
  EXPECT_EQ(m.max_query_len, 300);
  EXPECT_EQ(m.max_seq_len, 1000);
  EXPECT_EQ(m.total_kv_blocks, 1 + 2 + 8);
  EXPECT_EQ(m.token_position[100], 193);
  EXPECT_EQ(m.token_position[406], 999);
}

TEST(Metadata, Mixed) {
  const BatchSpec s = spec({1, 1, 50, 3}, {10, 129, 60, 3});
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 2);
  EXPECT_EQ(m.num_decode_tokens, 2);
  EXPECT_EQ(m.num_prefills, 2);
  EXPECT_EQ(m.num_prefill_tokens, 53);
  EXPECT_EQ(m.cu_seqlens_q, (V{0, 50, 53}));  // rebased past the decode tokens
  EXPECT_EQ(m.cu_seqlens_k, (V{0, 60, 63}));
  EXPECT_EQ(m.total_kv_blocks, 1 + 1);
  EXPECT_EQ(m.token_position[0], 9);
  EXPECT_EQ(m.token_position[1], 128);
  EXPECT_EQ(m.token_position[2], 10);
}

class SpecDecode : public ::testing::TestWithParam<int> {};

TEST_P(SpecDecode, VerifyRowsHaveConsecutivePositions) {
  const int q = GetParam();
  const BatchSpec s = spec({q, q, q, 200}, {q, 257, 1000, 300}, q);
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 3);
  EXPECT_EQ(m.decode_query_len, q);
  EXPECT_EQ(m.num_decode_tokens, 3 * q);
  for (int i = 0; i < q; ++i) {
    EXPECT_EQ(m.token_position[i], i);
    EXPECT_EQ(m.token_position[q + i], 257 - q + i);
    EXPECT_EQ(m.token_position[2 * q + i], 1000 - q + i);
  }
  EXPECT_EQ(m.cu_seqlens_q, (V{0, 200}));
  EXPECT_EQ(m.prefill_context_lens, V{100});
}

TEST_P(SpecDecode, ShortRequestAmongDecodesIsRejected) {
  const int q = GetParam();
  // A request of query length q - 1 <= threshold is a decode of another length.
  EXPECT_ERROR(spec({q, q - 1, 200}, {50, 50, 300}, q),
               "query_lens[1] = " + std::to_string(q - 1) + " but decode request 0 has query length " +
                   std::to_string(q));
}

INSTANTIATE_TEST_SUITE_P(Metadata, SpecDecode, ::testing::Values(2, 4));

TEST(Metadata, PaddingRequests) {
  // Decode batch padded to 5 requests (CUDA-graph shape), then a padded prefill
  // with rows and an empty one.
  const BatchSpec s = spec({1, 1, 1, 1, 1, 9, 0}, {7, 300, 0, 0, 0, 0, 0});
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 5);
  EXPECT_EQ(m.num_prefills, 2);
  EXPECT_EQ(m.token_position[2], -1);
  EXPECT_EQ(m.token_position[4], -1);
  for (int t = 5; t < 14; ++t) EXPECT_EQ(m.token_position[t], -1);
  EXPECT_EQ(m.context_lens[5], 0);
  EXPECT_EQ(m.cu_seqlens_k, (V{0, 0, 0}));
  EXPECT_EQ(m.total_kv_blocks, 0);
  EXPECT_EQ(m.num_blocks(2), 0);
}

// Decision (docs/DESIGN.md): query_len 0 is not a decode, so such a request is a
// prefill that owns no rows; with seq_len > 0 its context still counts in the
// prefill key metadata (cu_seqlens_k, max_seq_len, total_kv_blocks).
TEST(Metadata, ZeroLengthPrefillWithContext) {
  const BatchSpec s = spec({1, 0, 10}, {5, 300, 20});
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 1);
  EXPECT_EQ(m.num_prefills, 2);
  EXPECT_EQ(m.cu_seqlens_q, (V{0, 0, 10}));
  EXPECT_EQ(m.cu_seqlens_k, (V{0, 300, 320}));
  EXPECT_EQ(m.context_lens[1], 300);
  EXPECT_EQ(m.max_seq_len, 300);
  EXPECT_EQ(m.total_kv_blocks, 3 + 1);
  // ...and it ends the decode run.
  EXPECT_ERROR(spec({0, 1}, {4, 4}), "request 1 is a decode (query_lens[1] = 1 <= decode_threshold = 1) after prefill request 0");
}

TEST(Metadata, ThresholdZeroMakesEverythingPrefill) {
  const BatchSpec s = spec({1, 1, 4}, {3, 3, 9}, 0);
  const BatchMetadata m = msa::build_metadata(s);
  expect_consistent(s, m);
  EXPECT_EQ(m.num_decodes, 0);
  EXPECT_EQ(m.num_prefills, 3);
}

TEST(Metadata, RandomBatchesAreConsistent) {
  for (int trial = 0; trial < 300; ++trial) {
    const std::uint32_t seed = 1000 + trial;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int threshold = 1 + int(rng() % 4);
    const int dql = 1 + int(rng() % threshold);
    const int decodes = int(rng() % 6), prefills = int(rng() % 6);
    BatchSpec s = spec({}, {}, threshold);
    for (int i = 0; i < decodes; ++i) {
      s.query_lens.push_back(dql);
      s.seq_lens.push_back(rng() % 5 == 0 ? 0 : dql + int(rng() % 3000));
    }
    for (int i = 0; i < prefills; ++i) {
      const int q = rng() % 7 == 0 ? 0 : threshold + 1 + int(rng() % 400);
      s.query_lens.push_back(q);
      s.seq_lens.push_back(rng() % 6 == 0 ? 0 : q + int(rng() % 2000));
    }
    const BatchMetadata m = msa::build_metadata(s);
    expect_consistent(s, m);
    EXPECT_EQ(m.num_decodes, decodes);
  }
}

TEST(Metadata, Errors) {
  EXPECT_ERROR(spec({1, 2}, {3}), "query_lens has 2 entries but seq_lens has 1");
  EXPECT_ERROR(spec({1}, {3}, -1), "decode_threshold = -1 is negative");
  EXPECT_ERROR(spec({1, -3}, {3, 3}), "query_lens[1] = -3 is negative");
  EXPECT_ERROR(spec({1, 3}, {3, -2}), "seq_lens[1] = -2 is negative");
  EXPECT_ERROR(spec({1, 30}, {3, 20}), "seq_lens[1] = 20 is below query_lens[1] = 30");
  EXPECT_ERROR(spec({1, 50, 1}, {3, 60, 9}),
               "request 2 is a decode (query_lens[2] = 1 <= decode_threshold = 1) after prefill request 1");
  EXPECT_ERROR(spec({2, 3, 9}, {3, 3, 9}, 4),
               "query_lens[1] = 3 but decode request 0 has query length 2");
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  EXPECT_ERROR(spec({big, 1}, {0, 0}, 0), "the batch has 2147483648 tokens up to request 1");
  EXPECT_ERROR(spec({2, 2}, {big, big}), "the prefills hold 4294967294 keys up to request 1");
}

}  // namespace
