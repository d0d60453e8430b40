// Batch metadata of one engine step from the usual engine inputs: the query
// start locations and sequence lengths (host copies), the decode count and
// the decodes' query length.
#include <nanobind/stl/string.h>

#include <cstring>
#include <vector>

#include "bindings.hpp"
#include "msa/batch.hpp"
#include "msa/error.hpp"
#include "views.hpp"

namespace msa::py {

namespace {

std::vector<std::int32_t> host_int32(const Array& a, const char* arg) {
  Placement where;
  where.add(a, arg);
  MSA_CHECK(!where.cuda(), arg, ": pass the host copy (the metadata is built on the host)");
  expect_dtype(a, DType::i32, arg);
  expect_ndim(a, 1, arg, "one-dimensional");
  std::vector<std::int32_t> v(std::size_t(dim(a, 0)));
  const auto* p = ptr<const std::int32_t>(a);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = p[std::int64_t(i) * a.stride(0)];
  return v;
}

// query_start_loc: [num_requests + 1], seq_lens: [num_requests] int32 host
// arrays. num_decodes < 0: as many as lead with 0 < query_len <=
// decode_query_len; decode_query_len < 0: the first request's query length
// when num_decodes > 0, else 1.
BatchMetadata metadata(const Array& query_start_loc, const Array& seq_lens, std::int32_t num_decodes,
                       std::int32_t decode_query_len) {
  const std::vector<std::int32_t> qs = host_int32(query_start_loc, "query_start_loc");
  BatchSpec spec;
  spec.seq_lens = host_int32(seq_lens, "seq_lens");
  const std::size_t R = spec.seq_lens.size();
  MSA_CHECK(qs.size() == R + 1, "query_start_loc: ", qs.size(), " entries but seq_lens has ", R,
            " requests (query_start_loc needs num_requests + 1)");
  MSA_CHECK(qs[0] == 0, "query_start_loc[0] = ", qs[0], " but must be 0");
  for (std::size_t r = 0; r < R; ++r) spec.query_lens.push_back(qs[r + 1] - qs[r]);
  MSA_CHECK(num_decodes <= std::int32_t(R), "num_decodes = ", num_decodes, " but the step has ", R, " requests");
  if (decode_query_len < 0) decode_query_len = num_decodes > 0 ? spec.query_lens[0] : 1;
  spec.decode_threshold = num_decodes == 0 ? 0 : decode_query_len;
  BatchMetadata meta = build_metadata(spec);
  MSA_CHECK(num_decodes < 0 || meta.num_decodes == num_decodes, "num_decodes = ", num_decodes, " but ",
            meta.num_decodes, " requests lead the step with 0 < query_len <= decode_query_len = ",
            decode_query_len, " (decodes come first; a request after them must be longer)");
  return meta;
}

const std::vector<std::int32_t>& field(const BatchMetadata& m, const std::string& name) {
  if (name == "query_start") return m.query_start;
  if (name == "seq_lens") return m.seq_lens;
  if (name == "context_lens") return m.context_lens;
  if (name == "token_request") return m.token_request;
  if (name == "token_position") return m.token_position;
  if (name == "cu_seqlens_q") return m.cu_seqlens_q;
  if (name == "cu_seqlens_k") return m.cu_seqlens_k;
  if (name == "prefill_seq_lens") return m.prefill_seq_lens;
  if (name == "prefill_context_lens") return m.prefill_context_lens;
  fail("BatchMetadata has no array '", name, "'");
}

// Copies array `name` into `out` (host int32, one-dimensional, its length).
void copy_to(const BatchMetadata& m, const std::string& name, const OutArray& written) {
  const Array out = as_array(written);
  const std::vector<std::int32_t>& v = field(m, name);
  Placement where;
  where.add(out, "out");
  MSA_CHECK(!where.cuda(), "out: must be host memory");
  expect_dtype(out, DType::i32, "out");
  expect_shape(out, {std::int64_t(v.size())}, "out", "the array's length");
  expect_contiguous(out, "out");
  if (!v.empty()) std::memcpy(data_of(out), v.data(), v.size() * sizeof(std::int32_t));
}

}  // namespace

void bind_metadata(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<BatchMetadata>(m, "BatchMetadata",
                            "Host metadata of one engine step (include/msa/batch.hpp), shared by every layer.")
      .def_ro("num_requests", &BatchMetadata::num_requests)
      .def_ro("num_tokens", &BatchMetadata::num_tokens)
      .def_ro("num_decodes", &BatchMetadata::num_decodes)
      .def_ro("num_decode_tokens", &BatchMetadata::num_decode_tokens)
      .def_ro("decode_query_len", &BatchMetadata::decode_query_len)
      .def_ro("num_prefills", &BatchMetadata::num_prefills)
      .def_ro("num_prefill_tokens", &BatchMetadata::num_prefill_tokens)
      .def_ro("max_query_len", &BatchMetadata::max_query_len)
      .def_ro("max_seq_len", &BatchMetadata::max_seq_len)
      .def_ro("total_kv_blocks", &BatchMetadata::total_kv_blocks)
      .def("length", [](const BatchMetadata& m, const std::string& name) { return field(m, name).size(); },
           "name"_a, "Entries of array `name` (query_start, seq_lens, context_lens, token_request, ...).")
      .def("copy_to", &copy_to, "name"_a, "out"_a, "Copies array `name` into a host int32 array of its length.")
      .def("__repr__", [](const BatchMetadata& m) {
        return detail::concat("BatchMetadata(requests=", m.num_requests, ", tokens=", m.num_tokens,
                              ", decodes=", m.num_decodes, " x ", m.decode_query_len, ", prefills=", m.num_prefills,
                              " with ", m.num_prefill_tokens, " tokens)");
      });
  m.def("build_metadata", &metadata, "query_start_loc"_a, "seq_lens"_a, nb::kw_only(), "num_decodes"_a = -1,
        "decode_query_len"_a = -1,
        "The step's BatchMetadata from host int32 query_start_loc [num_requests + 1] and seq_lens "
        "[num_requests] (0 marks a padding request); decodes lead the batch.");
}

}  // namespace msa::py
