// Cache slots of the tokens an engine writes with insert_kv / insert_index. A
// slot is page * 128 + offset: absolute position p of request r lives in the
// page of its logical block p / 128 (the block table's entry), at offset p % 128.
#pragma once

#include <cstdint>
#include <vector>

#include "msa/batch.hpp"
#include "msa/cache.hpp"

namespace msa {

// Slot of position `position` of request `r` through a host block table. Throws
// msa::Error naming the value when r is not a row of the table, the position is
// negative or its block is past max_blocks, or the table's entry is negative.
std::int64_t slot_of(const BlockTable& table, std::int32_t r, std::int64_t position);

// Slots of every token of a step, in token order (the slot mapping of the
// step's inserts), through a host block table with one row per request.
// Tokens of padding requests (seq_len 0) get -1, which the inserts skip.
//   returns: [meta.num_tokens]
std::vector<std::int64_t> step_slots(const BatchMetadata& meta, const BlockTable& table);

}  // namespace msa
