// Stub: owner fills in.
#include "msa/batch.hpp"
#include "msa/error.hpp"
namespace msa {
StepView BatchMetadata::view() const { fail("BatchMetadata::view: not implemented yet"); }
BatchMetadata build_metadata(const BatchSpec&) { fail("build_metadata: not implemented yet"); }
}  // namespace msa
