// The part of check::indexer_shape that concerns the scoring inputs only (no
// output view, no top-k numbers), for cpu::block_scores. Defined in
// src/core/check_indexer.cpp next to indexer_shape.
#pragma once

#include "msa/batch.hpp"
#include "msa/ops.hpp"

namespace msa::check {

// Step view shape, index queries, number of KV heads, index cache and block
// table; reads no tensor data. Throws msa::Error naming the argument and value.
void indexer_inputs_shape(const StepView& step, const IndexerArgs& args);

}  // namespace msa::check
