// The driver's tensor-map encoder (cuTensorMapEncodeTiled), fetched once
// through the runtime so that nothing links libcuda: the TMA maps of the
// attention and of the indexer are encoded with it.
#pragma once

#include <cudaTypedefs.h>

namespace msa::cuda {

// The encoder, or null when the driver does not offer it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

}  // namespace msa::cuda
