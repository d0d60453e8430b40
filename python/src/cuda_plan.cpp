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

// The problem (an AttentionArgs whose plain fields say it) and the tuning of a
// plan, from a dict of fields by name (msa.AttentionShape in Python); absent
// fields keep their defaults (bf16 everywhere, top-k 16), unknown names are refused.
struct Shape {
  AttentionArgs problem;
  cuda::AttentionTuning tuning;
};
Shape make_shape(const nb::dict& fields) {
  Shape s;
  s.problem.topk.topk = 16;
  bool token_scales = false;
  for (const auto& [key, value] : fields) {
    const std::string name = nb::cast<std::string>(key);
    if (name == "num_q_heads") s.problem.num_q_heads = nb::cast<std::int32_t>(value);
    else if (name == "num_kv_heads") s.problem.cache.num_kv_heads = nb::cast<std::int32_t>(value);
    else if (name == "topk") s.problem.topk.topk = nb::cast<std::int32_t>(value);
    else if (name == "q_dtype") s.problem.q_dtype = parse_dtype(nb::cast<std::string>(value), "q_dtype");
    else if (name == "kv_dtype") s.problem.cache.dtype = parse_dtype(nb::cast<std::string>(value), "kv_dtype");
    else if (name == "out_dtype") s.problem.out_dtype = parse_dtype(nb::cast<std::string>(value), "out_dtype");
    else if (name == "prefill_order") s.tuning.prefill_order = parse_prefill_order(nb::cast<std::string>(value));
    else if (name == "decode_splits") s.tuning.decode_splits = nb::cast<std::int32_t>(value);
    else if (name == "tile_splits") s.tuning.tile_splits = nb::cast<std::int32_t>(value);
    else if (name == "kv_token_scales") token_scales = nb::cast<bool>(value);
    else if (name == "widen_bytes") s.tuning.widen_bytes = nb::cast<std::int64_t>(value);
    else fail("attention shape: no field '", name, "'");
  }
  s.problem.cache.scale_mode = token_scales ? ScaleMode::per_token_head : ScaleMode::per_tensor;
  return s;
}

nb::dict plan_info(const Array& blob) {
  const cuda::AttentionPlan p = read_plan(blob);
  const cuda::AttentionSchedule& s = p.schedule;
  nb::dict d;
  d["num_tokens"] = s.num_tokens;
  d["num_decode_tokens"] = s.num_decode_tokens;
  d["decode_splits"] = s.decode_splits;
  d["prefill_splits"] = s.prefill_splits;
  d["workspace_bytes"] = p.workspace.bytes;
  d["key_major_rows"] = s.key_major_rows;
  d["tile_splits"] = s.tile_splits;
  d["widen_pages"] = s.widen_pages;
  return d;
}

}  // namespace

void bind_plan(nb::module_& m) {
  using namespace nb::literals;
  m.attr("attention_plan_bytes") = kPlanBytes;
  m.def(
      "attention_workspace_bytes",
      [](const BatchMetadata& meta, const nb::dict& shape) {
        const Shape s = make_shape(shape);
        return cuda::attention_workspace_bytes(meta, s.problem, s.tuning);
      },
      "meta"_a, "shape"_a, "Device bytes the attention plan of this step needs.");
  m.def(
      "plan_attention",
      [](const BatchMetadata& meta, const nb::dict& shape, const OutArray& workspace_array, const OutArray& plan,
         std::uintptr_t stream) {
        const Array workspace = as_array(workspace_array);
        Placement where;
        where.add(workspace, "workspace");
        MSA_CHECK(where.cuda(), "workspace: the attention workspace must be CUDA device memory");
        const Shape s = make_shape(shape);
        DeviceGuard guard(where.device());
        write_plan(cuda::plan_attention(meta, s.problem, {data_of(workspace), workspace.nbytes()}, stream_ptr(stream),
                                        s.tuning),
                   as_array(plan));
      },
      "meta"_a, "shape"_a, "workspace"_a, "plan"_a, nb::kw_only(), "stream"_a = 0,
      "Plans the attention of this step into `workspace` (device, at least attention_workspace_bytes) and "
      "writes the plan into `plan` (host uint8, attention_plan_bytes). Enqueues the workspace's "
      "initialisation on `stream`; attend must run on the same stream.");
  m.def("plan_info", &plan_info, "plan"_a, "The plan's split counts and sizes, from its blob.");
}

}  // namespace msa::py
