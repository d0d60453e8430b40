// msa._msa.testing.reference_step: one engine step synthesized by the C++
// workload (tests/support/workload.hpp: shuffled pages, cached context already
// inserted, clustered index keys) and run through the C++ CPU engine directly.
// It returns the step's inputs, the caches before the insert, and everything
// the C++ engine wrote, so that a Python test can run the same step through
// the bindings and require identical bytes.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <vector>

#include "bindings.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "workload.hpp"

namespace msa::py {

namespace {

// A flat numpy array owning a copy of `v`.
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(const std::vector<T>& v) {
  auto* heap = new std::vector<T>(v);
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), {heap->size()}, owner);
}

template <typename T>
T get(const nb::dict& d, const char* key, T fallback) {
  return d.contains(key) ? nb::cast<T>(d[key]) : fallback;
}

WorkloadSpec make_spec(const nb::dict& s) {
  WorkloadSpec w;
  w.model = ModelConfig::minimax_m3(get<int>(s, "tp", 4));
  w.model.num_q_heads = get<int>(s, "num_q_heads", w.model.num_q_heads);
  w.model.num_kv_heads = get<int>(s, "num_kv_heads", w.model.num_kv_heads);
  w.model.topk = get<int>(s, "topk", w.model.topk);
  w.model.init_blocks = get<int>(s, "init_blocks", w.model.init_blocks);
  w.model.local_blocks = get<int>(s, "local_blocks", w.model.local_blocks);
  w.kv_dtype = parse_dtype(get<std::string>(s, "kv_dtype", "bf16"), "kv_dtype");
  w.layout = parse_layout(get<std::string>(s, "layout", "hnd").c_str(), "layout");
  w.fp8_scales = get<std::string>(s, "kv_scales", "tensor") == "token" ? ScaleMode::per_token_head
                                                                         : ScaleMode::per_tensor;
  w.q_dtype = parse_dtype(get<std::string>(s, "q_dtype", "bf16"), "q_dtype");
  w.index_dtype = parse_dtype(get<std::string>(s, "index_dtype", "bf16"), "index_dtype");
  for (const nb::handle r : nb::cast<nb::list>(s["requests"])) {
    const nb::tuple t = nb::cast<nb::tuple>(r);
    w.requests.push_back(RequestShape{nb::cast<std::int32_t>(t[0]), nb::cast<std::int32_t>(t[1])});
  }
  w.decode_threshold = get<int>(s, "decode_threshold", 1);
  w.seed = get<std::uint64_t>(s, "seed", 0);
  w.spare_pages = get<std::int64_t>(s, "spare_pages", -1);
  w.page_stride = get<std::int64_t>(s, "page_stride", 0);
  w.num_threads = get<int>(s, "num_threads", 0);
  return w;
}

nb::dict reference_step(const nb::dict& spec) {
  Workload w(make_spec(spec));
  nb::dict d;
  // The inputs, and the caches as the step finds them.
  d["kv_before"] = to_numpy(w.kv_bytes);
  d["index_before"] = to_numpy(w.index_bytes);
  d["k_scales_before"] = to_numpy(w.k_scales);
  d["v_scales_before"] = to_numpy(w.v_scales);
  d["block_table"] = to_numpy(w.block_table);
  d["index_block_table"] = to_numpy(w.index_block_table);
  d["new_k"] = to_numpy(w.new_k);
  d["new_v"] = to_numpy(w.new_v);
  d["new_index_k"] = to_numpy(w.new_index_k);
  d["slots"] = to_numpy(w.slots);
  d["index_slots"] = to_numpy(w.index_slots);
  d["q"] = to_numpy(w.q);
  d["index_q"] = to_numpy(w.index_q);
  d["query_start"] = to_numpy(w.meta().query_start);
  d["seq_lens"] = to_numpy(w.meta().seq_lens);
  d["num_decodes"] = w.meta().num_decodes;
  d["decode_query_len"] = w.meta().decode_query_len;
  d["num_tokens"] = w.num_tokens();
  d["num_pages"] = w.num_pages;
  d["index_num_pages"] = w.index_num_pages;
  d["table_stride"] = w.table_stride;
  d["k_scale"] = w.k_scale;
  d["v_scale"] = w.v_scale;
  d["q_scale"] = w.q_scale;
  d["src_dtype"] = dtype_name(w.src_dtype());
  d["out_dtype"] = dtype_name(w.out_dtype());
  d["num_q_heads"] = w.model().num_q_heads;
  d["num_kv_heads"] = w.model().num_kv_heads;
  d["topk"] = w.model().topk;
  d["softmax_scale"] = w.model().softmax_scale;
  // The step through the C++ CPU engine.
  {
    nb::gil_scoped_release nogil;
    const cpu::Options opt = w.cpu_options();
    const StepView step = w.step();
    cpu::insert_kv(w.kv_view(), w.insert_kv_args(), opt);
    cpu::insert_index(w.index_view(), w.insert_index_args(), opt);
    cpu::index(step, w.indexer_args(), opt);
    cpu::attend(step, w.attention_args(), opt);
  }
  d["kv_after"] = to_numpy(w.kv_bytes);
  d["index_after"] = to_numpy(w.index_bytes);
  d["k_scales_after"] = to_numpy(w.k_scales);
  d["v_scales_after"] = to_numpy(w.v_scales);
  d["topk_out"] = to_numpy(w.topk);
  d["out"] = to_numpy(w.out);
  d["lse"] = to_numpy(w.lse);
  return d;
}

}  // namespace

void bind_testing(nb::module_& m) {
  using namespace nb::literals;
  m.def("reference_step", &reference_step, "spec"_a,
        "Synthesizes a step (tp, num_q_heads, num_kv_heads, topk, init_blocks, local_blocks, kv_dtype, "
        "layout, kv_scales, q_dtype, index_dtype, requests=[(query_len, context_len), ...], "
        "decode_threshold, seed, spare_pages, page_stride, num_threads) and runs insert, index and "
        "attend on the C++ CPU engine; returns inputs, caches before and after, top-k, out, lse.");
}

}  // namespace msa::py
