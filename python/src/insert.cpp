// insert_kv, insert_index: the step's new K / V and index keys into the paged caches.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "backend.hpp"
#include "bindings.hpp"
#include "msa/error.hpp"
#include "views.hpp"

namespace msa::py {

namespace {

// k, v: [num_tokens, num_kv_heads, 128] bf16 / fp16; slots: [num_tokens] int64.
void insert_kv(const KVCacheArgs& kv, const Array& k, const Array& v, const Array& slots,
               const OptString& src_dtype, std::uintptr_t stream, int num_threads, const OptArray& check) {
  Placement where;
  const KVCacheView cache = kv_cache_view(kv, where);
  where.add(k, "k");
  where.add(v, "v");
  where.add(slots, "slots");
  InsertKVArgs args;
  args.src_dtype = element_dtype(k, src_dtype, "k");
  MSA_CHECK(element_dtype(v, src_dtype, "v") == args.src_dtype, "v: dtype ", dlpack_dtype_name(v),
            " but k holds ", dtype_name(args.src_dtype));
  expect_shape(k, {-1, cache.num_kv_heads, kHeadDim}, "k", "[num_tokens, num_kv_heads, 128]");
  expect_shape(v, {dim(k, 0), cache.num_kv_heads, kHeadDim}, "v", "[num_tokens, num_kv_heads, 128] like k");
  expect_shape(slots, {dim(k, 0)}, "slots", "[num_tokens]");
  expect_contiguous(k, "k");
  expect_contiguous(v, "v");
  expect_contiguous(slots, "slots");
  expect_int64(slots, "slots");
  args.k = data_of(k);
  args.v = data_of(v);
  args.slots = ptr<const std::int64_t>(slots);
  args.num_tokens = dim(k, 0);
  if (where.cuda()) {
#if MSA_HAVE_CUDA
    const cuda::DeviceCheck dc = device_check(check, where);
    DeviceGuard guard(where.device());
    cuda::insert_kv(cache, args, stream_ptr(stream), dc);
#else
    (void)stream, (void)check;
    require_cuda_build("insert_kv");
#endif
    return;
  }
  nb::gil_scoped_release nogil;
  cpu::insert_kv(cache, args, cpu_options(num_threads));
}

// index_k: [num_tokens, 128] bf16 / fp16; slots: [num_tokens] int64.
void insert_index(const OutArray& index_cache, const Array& index_k, const Array& slots,
                  const OptString& index_dtype, const OptString& src_dtype, std::uintptr_t stream, int num_threads,
                  const OptOutArray& check) {
  Placement where;
  const IndexCacheView cache = index_cache_view(as_array(index_cache), index_dtype, where);
  where.add(index_k, "index_k");
  where.add(slots, "slots");
  InsertIndexArgs args;
  args.src_dtype = element_dtype(index_k, src_dtype, "index_k");
  expect_shape(index_k, {-1, kHeadDim}, "index_k", "[num_tokens, 128]");
  expect_shape(slots, {dim(index_k, 0)}, "slots", "[num_tokens]");
  expect_contiguous(index_k, "index_k");
  expect_contiguous(slots, "slots");
  expect_int64(slots, "slots");
  args.index_k = data_of(index_k);
  args.slots = ptr<const std::int64_t>(slots);
  args.num_tokens = dim(index_k, 0);
  if (where.cuda()) {
#if MSA_HAVE_CUDA
    const cuda::DeviceCheck dc = device_check(as_array(check), where);
    DeviceGuard guard(where.device());
    cuda::insert_index(cache, args, stream_ptr(stream), dc);
#else
    (void)stream, (void)check;
    require_cuda_build("insert_index");
#endif
    return;
  }
  nb::gil_scoped_release nogil;
  cpu::insert_index(cache, args, cpu_options(num_threads));
}

}  // namespace

void bind_insert(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "insert_kv",
      [](const OutArray& kv_cache, const Array& k, const Array& v, const Array& slots, const OptString& kv_dtype,
         float k_scale, float v_scale, const OptOutArray& k_scales, const OptOutArray& v_scales,
         const OptString& src_dtype, std::uintptr_t stream, int num_threads, const OptOutArray& check) {
        insert_kv(KVCacheArgs{as_array(kv_cache), kv_dtype, k_scale, v_scale, as_array(k_scales), as_array(v_scales)},
                  k, v, slots, src_dtype, stream, num_threads, as_array(check));
      },
      "kv_cache"_a, "k"_a, "v"_a, "slots"_a, nb::kw_only(), "kv_dtype"_a = nb::none(), "k_scale"_a = 1.0f,
      "v_scale"_a = 1.0f, "k_scales"_a = nb::none(), "v_scales"_a = nb::none(), "src_dtype"_a = nb::none(),
      "stream"_a = 0, "num_threads"_a = 0, "check"_a = nb::none(),
      "Writes K and V ([num_tokens, num_kv_heads, 128]) of each token with slots[i] >= 0 into the KV "
      "cache, quantizing as its dtype asks.");
  m.def("insert_index", &insert_index, "index_cache"_a, "index_k"_a, "slots"_a, nb::kw_only(),
        "index_dtype"_a = nb::none(), "src_dtype"_a = nb::none(), "stream"_a = 0, "num_threads"_a = 0,
        "check"_a = nb::none(),
        "Writes each token's index key ([num_tokens, 128]) with slots[i] >= 0 into the index cache.");
}

}  // namespace msa::py
