// Element types and model numbers, by name.
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "msa/config.hpp"
#include "msa/dtype.hpp"

#if MSA_HAVE_CUDA
#include "msa/cuda.hpp"
#endif

namespace msa::py {

void bind_types(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "dtype_name", [](const std::string& name) { return std::string(dtype_name(parse_dtype(name))); }, "name"_a,
      "The canonical name of a dtype (bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4, f32, i32); accepts aliases.");
  m.def(
      "dtype_bytes", [](const std::string& name) { return dtype_bytes(parse_dtype(name)); }, "name"_a,
      "Bytes per element (0 for nvfp4, which packs two codes per byte).");
  m.def(
      "minimax_m3",
      [](int tp) {
        const ModelConfig c = ModelConfig::minimax_m3(tp);
        nb::dict d;
        d["num_q_heads"] = c.num_q_heads;
        d["num_kv_heads"] = c.num_kv_heads;
        d["head_dim"] = c.head_dim;
        d["block_size"] = c.block_size;
        d["topk"] = c.topk;
        d["init_blocks"] = c.init_blocks;
        d["local_blocks"] = c.local_blocks;
        d["softmax_scale"] = c.softmax_scale;
        return d;
      },
      "tp"_a = 1, "Per-rank numbers of a MiniMax-M3 sparse layer at tensor-parallel degree tp (1, 2, 4, 8).");
  m.attr("block_size") = kBlockSize;
  m.attr("head_dim") = kHeadDim;
  m.attr("max_topk") = kMaxTopk;
#if MSA_HAVE_CUDA
  m.attr("has_cuda") = true;
  m.def("cuda_device_count", &cuda::device_count, "Usable CUDA devices (0 without a driver or device).");
#else
  m.attr("has_cuda") = false;
  m.def("cuda_device_count", [] { return 0; }, "Usable CUDA devices: 0, this build has no CUDA backend.");
#endif
}

}  // namespace msa::py
