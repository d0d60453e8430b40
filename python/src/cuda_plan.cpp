// The attention plan / workspace API of the CUDA backend (plan_attention):
// host work from the step's host metadata, once per step, outside any graph.
#include <nanobind/stl/string.h>

#include "backend.hpp"
#include "bindings.hpp"
#include "msa/error.hpp"
#include "plan_blob.hpp"

namespace msa::py {

namespace {

cuda::PrefillOrder parse_prefill_order(const std::string& name) {
  if (name == "query_major" || name == "query-major") return cuda::PrefillOrder::query_major;
  if (name == "key_major" || name == "key-major") return cuda::PrefillOrder::key_major;
  if (name == "auto" || name == "automatic") return cuda::PrefillOrder::automatic;
  fail("prefill_order = '", name, "' is not one of query_major, key_major, auto");
}

// msa::cuda::AttentionShape from a dict of its fields by name (msa.AttentionShape
// in Python); absent fields keep the struct's defaults, unknown names are refused.
cuda::AttentionShape make_shape(const nb::dict& fields) {
  cuda::AttentionShape s;
  for (const auto& [key, value] : fields) {
    const std::string name = nb::cast<std::string>(key);
    if (name == "num_q_heads") s.num_q_heads = nb::cast<std::int32_t>(value);
    else if (name == "num_kv_heads") s.num_kv_heads = nb::cast<std::int32_t>(value);
    else if (name == "topk") s.topk = nb::cast<std::int32_t>(value);
    else if (name == "q_dtype") s.q_dtype = parse_dtype(nb::cast<std::string>(value), "q_dtype");
    else if (name == "kv_dtype") s.kv_dtype = parse_dtype(nb::cast<std::string>(value), "kv_dtype");
    else if (name == "out_dtype") s.out_dtype = parse_dtype(nb::cast<std::string>(value), "out_dtype");
    else if (name == "prefill_order") s.prefill_order = parse_prefill_order(nb::cast<std::string>(value));
    else if (name == "decode_splits") s.decode_splits = nb::cast<std::int32_t>(value);
    else if (name == "tile_splits") s.tile_splits = nb::cast<std::int32_t>(value);
    else if (name == "kv_token_scales") s.kv_token_scales = nb::cast<bool>(value);
    else if (name == "widen_bytes") s.widen_bytes = nb::cast<std::int64_t>(value);
    else fail("attention shape: no field '", name, "'");
  }
  return s;
}

nb::dict plan_info(const Array& blob) {
  const cuda::AttentionPlan p = read_plan(blob);
  nb::dict d;
  d["num_tokens"] = p.num_tokens;
  d["num_decode_tokens"] = p.num_decode_tokens;
  d["decode_splits"] = p.decode_splits;
  d["prefill_splits"] = p.prefill_splits;
  d["workspace_bytes"] = p.workspace_bytes;
  d["key_major_rows"] = p.key_major_rows;
  d["tile_splits"] = p.tile_splits;
  d["widen_pages"] = p.widen_pages;
  return d;
}

}  // namespace

void bind_plan(nb::module_& m) {
  using namespace nb::literals;
  m.attr("attention_plan_bytes") = kPlanBytes;
  m.def(
      "attention_workspace_bytes",
      [](const BatchMetadata& meta, const nb::dict& shape) {
        return cuda::attention_workspace_bytes(meta, make_shape(shape));
      },
      "meta"_a, "shape"_a, "Device bytes the attention plan of this step needs.");
  m.def(
      "plan_attention",
      [](const BatchMetadata& meta, const nb::dict& shape, const Array& workspace, const Array& plan,
         std::uintptr_t stream) {
        Placement where;
        where.add(workspace, "workspace");
        MSA_CHECK(where.cuda(), "workspace: the attention workspace must be CUDA device memory");
        const cuda::AttentionShape s = make_shape(shape);
        DeviceGuard guard(where.device());
        write_plan(cuda::plan_attention(meta, s, data_of(workspace), workspace.nbytes(), stream_ptr(stream)), plan);
      },
      "meta"_a, "shape"_a, "workspace"_a, "plan"_a, nb::kw_only(), "stream"_a = 0,
      "Plans the attention of this step into `workspace` (device, at least attention_workspace_bytes) and "
      "writes the plan into `plan` (host uint8, attention_plan_bytes). Enqueues the workspace's "
      "initialisation on `stream`; attend must run on the same stream.");
  m.def("plan_info", &plan_info, "plan"_a, "The plan's split counts and sizes, from its blob.");
}

}  // namespace msa::py
