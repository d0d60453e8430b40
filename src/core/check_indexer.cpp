// Stub: owner fills in.
#include "core/checks.hpp"
namespace msa::check {
void indexer_shape(const StepView&, const IndexerArgs&) {}
}  // namespace msa::check
