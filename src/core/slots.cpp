#include "msa/slots.hpp"

#include "msa/error.hpp"

namespace msa {

std::int64_t slot_of(const BlockTable& table, std::int32_t r, std::int64_t position) {
  MSA_CHECK(r >= 0 && r < table.num_rows, "request ", r, " is not a row of the block table (",
            table.num_rows, " rows)");
  MSA_CHECK(position >= 0, "position ", position, " of request ", r, " is negative");
  const std::int64_t b = position / kBlockSize;
  MSA_CHECK(b < table.max_blocks, "position ", position, " of request ", r, " is in block ", b,
            " but the block table has ", table.max_blocks, " blocks per row");
  MSA_CHECK(table.data != nullptr, "block_table.data is null");
  const std::int32_t page = table.at(r, b);
  MSA_CHECK(page >= 0, "block_table[r=", r, ", b=", b, "] = ", page, ": position ", position,
            " of request ", r, " has no page");
  return std::int64_t(page) * kBlockSize + position % kBlockSize;
}

std::vector<std::int64_t> step_slots(const BatchMetadata& meta, const BlockTable& table) {
  MSA_CHECK(table.num_rows >= meta.num_requests, "the block table has ", table.num_rows,
            " rows but the step has ", meta.num_requests, " requests");
  std::vector<std::int64_t> slots(static_cast<std::size_t>(meta.num_tokens), -1);
  for (std::int32_t t = 0; t < meta.num_tokens; ++t) {
    const std::int32_t p = meta.token_position[t];
    if (p >= 0) slots[t] = slot_of(table, meta.token_request[t], p);
  }
  return slots;
}

}  // namespace msa
