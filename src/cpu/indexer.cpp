// Stub: owner fills in.
#include "msa/cpu.hpp"
#include "msa/error.hpp"
namespace msa::cpu {
void block_scores(const StepView&, const IndexerArgs&, float*, std::int32_t, const Options&) { fail("cpu::block_scores: not implemented yet"); }
void select_row(const float*, std::int32_t, std::int32_t, std::int32_t, std::int32_t, std::int32_t*) { fail("cpu::select_row: not implemented yet"); }
void index(const StepView&, const IndexerArgs&, const Options&) { fail("cpu::index: not implemented yet"); }
}  // namespace msa::cpu
