// Stub: owner fills in.
#include "msa/cpu.hpp"
#include "msa/error.hpp"
namespace msa::cpu {
void attend(const StepView&, const AttentionArgs&, const Options&) { fail("cpu::attend: not implemented yet"); }
}  // namespace msa::cpu
