// Stub: owner fills in.
#include "core/checks.hpp"
namespace msa::check {
void attention_shape(const StepView&, const AttentionArgs&) {}
}  // namespace msa::check
