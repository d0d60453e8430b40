// slot_of and step_slots (include/msa/slots.hpp): the slot mapping of a step
// through a block table, against the workload's own slot computation, with
// padding rows and every error naming its value.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "expect_error.hpp"
#include "msa/batch.hpp"
#include "msa/cache.hpp"
#include "msa/slots.hpp"
#include "workload.hpp"

namespace {

using msa::test::expect_error;

TEST(Slots, MatchTheWorkloadsMappingOnShuffledPages) {
  msa::WorkloadSpec spec;
  spec.model = msa::ModelConfig::minimax_m3(8);
  spec.decode_threshold = 2;
  // Decodes of 2 tokens, then prefills with and without context, one ending on a page edge.
  spec.requests = {{2, 127}, {2, 1}, {2, 300}, {129, 0}, {200, 56}, {3, 2045}, {0, 0}};
  spec.seed = 41;
  spec.num_threads = 2;
  msa::Workload w(spec);
  EXPECT_EQ(msa::step_slots(w.meta(), w.table()), w.slots);
  EXPECT_EQ(msa::step_slots(w.meta(), w.index_table()), w.index_slots);
  // Token 0 is request 0's position 127: the last slot of its block 0.
  EXPECT_EQ(msa::slot_of(w.table(), 0, 127), std::int64_t(w.page(0, 0)) * 128 + 127);
  EXPECT_EQ(msa::slot_of(w.table(), 0, 128), std::int64_t(w.page(0, 1)) * 128);
}

TEST(Slots, PaddingRequestsGetMinusOne) {
  msa::BatchSpec spec;
  spec.query_lens = {1, 1, 3};
  spec.seq_lens = {0, 130, 3};  // request 0 pads a captured decode shape
  const msa::BatchMetadata meta = msa::build_metadata(spec);
  const std::vector<std::int32_t> table = {-1, -1, 5, 9, 2, -1};  // [3 rows, 2 blocks]
  const msa::BlockTable t{table.data(), 3, 2, 2};
  const std::vector<std::int64_t> want = {-1, 9 * 128 + 1, 2 * 128, 2 * 128 + 1, 2 * 128 + 2};
  EXPECT_EQ(msa::step_slots(meta, t), want);
}

TEST(Slots, BadInputNamesTheValue) {
  const std::vector<std::int32_t> table = {4, -1, 7, 8};  // [2 rows, 2 blocks]
  const msa::BlockTable t{table.data(), 2, 2, 2};
  expect_error([&] { msa::slot_of(t, 0, 200); }, {"block_table[r=0, b=1] = -1", "position 200"});
  expect_error([&] { msa::slot_of(t, 1, 256); }, {"position 256", "block 2", "2 blocks per row"});
  expect_error([&] { msa::slot_of(t, 2, 0); }, {"request 2", "2 rows"});
  expect_error([&] { msa::slot_of(t, 0, -3); }, {"position -3", "negative"});
  msa::BatchSpec spec;
  spec.query_lens = {1, 1, 1};
  spec.seq_lens = {1, 1, 1};
  expect_error([&] { msa::step_slots(msa::build_metadata(spec), t); }, {"2 rows", "3 requests"});
}

}  // namespace
