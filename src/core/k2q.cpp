// Stub: owner fills in.
#include "msa/k2q.hpp"
#include "msa/error.hpp"
namespace msa {
K2QPlan build_k2q(const StepView&, const TopkView&, int, std::int32_t, std::int32_t) {
  fail("build_k2q: not implemented yet");
}
}  // namespace msa
