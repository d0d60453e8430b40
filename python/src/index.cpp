// index: block scores of every (token, KV head) over its request's index keys,
// then the top-k selection, written into the caller's top-k buffer.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "backend.hpp"
#include "bindings.hpp"
#include "msa/error.hpp"
#include "views.hpp"

namespace msa::py {

namespace {

// index_q: [num_tokens, num_kv_heads, 128] bf16 / fp16; topk: [num_tokens,
// num_kv_heads, topk] int32 written; workspace (CUDA): >= index_workspace_bytes.
void index(const StepArgs& s, const Array& index_q, const Array& index_cache, const Array& block_table,
           const Array& topk, const OptString& index_dtype, const OptString& iq_dtype, int init_blocks,
           int local_blocks, int max_blocks, const OptArray& workspace, std::uintptr_t stream, int num_threads,
           const OptArray& check) {
  Placement where;
  const StepView step = step_view(s, where);
  IndexerArgs args;
  args.cache = index_cache_view(index_cache, index_dtype, where);
  args.block_table = block_table_view(block_table, "block_table", where);
  args.out = topk_view(topk, "topk", where);
  where.add(index_q, "index_q");
  args.iq_dtype = element_dtype(index_q, iq_dtype, "index_q");
  expect_shape(index_q, {step.num_tokens, -1, kHeadDim}, "index_q", "[num_tokens, num_kv_heads, 128]");
  expect_contiguous(index_q, "index_q");
  expect_shape(topk, {step.num_tokens, dim(index_q, 1), -1}, "topk", "[num_tokens, num_kv_heads, topk]");
  args.index_q = data_of(index_q);
  args.num_kv_heads = std::int32_t(dim(index_q, 1));
  args.init_blocks = init_blocks;
  args.local_blocks = local_blocks;
  if (where.cuda()) {
#if MSA_HAVE_CUDA
    if (max_blocks < 0) max_blocks = args.block_table.max_blocks;
    const std::size_t need = cuda::index_workspace_bytes(step.num_tokens, args.num_kv_heads, max_blocks);
    MSA_CHECK(workspace.has_value() || need == 0, "workspace: index needs ", need,
              " bytes of device workspace (index_workspace_bytes) but none was given");
    void* ws = nullptr;
    std::size_t ws_bytes = 0;
    if (workspace) {
      where.add(*workspace, "workspace");
      ws = data_of(*workspace);
      ws_bytes = workspace->nbytes();
    }
    const cuda::DeviceCheck dc = device_check(check, where);
    DeviceGuard guard(where.device());
    cuda::index(step, args, max_blocks, {ws, ws_bytes}, stream_ptr(stream), dc);
#else
    (void)max_blocks, (void)workspace, (void)stream, (void)check;
    require_cuda_build("index");
#endif
    return;
  }
  nb::gil_scoped_release nogil;
  cpu::index(step, args, cpu_options(num_threads));
}

}  // namespace

void bind_index(nb::module_& m) {
  using namespace nb::literals;
  m.def(
      "index",
      [](const Array& query_start, const Array& seq_lens, const Array& token_request, std::int32_t num_decodes,
         std::int32_t decode_query_len, const Array& index_q, const Array& index_cache, const Array& block_table,
         const OutArray& topk, const OptString& index_dtype, const OptString& iq_dtype, int init_blocks,
         int local_blocks, int max_blocks, const OptOutArray& workspace, std::uintptr_t stream, int num_threads,
         const OptOutArray& check) {
        index(StepArgs{query_start, seq_lens, token_request, num_decodes, decode_query_len}, index_q, index_cache,
              block_table, as_array(topk), index_dtype, iq_dtype, init_blocks, local_blocks, max_blocks,
              as_array(workspace), stream, num_threads, as_array(check));
      },
      "query_start"_a, "seq_lens"_a, "token_request"_a, "num_decodes"_a, "decode_query_len"_a, "index_q"_a,
      "index_cache"_a, "block_table"_a, "topk"_a, nb::kw_only(), "index_dtype"_a = nb::none(),
      "iq_dtype"_a = nb::none(), "init_blocks"_a = 0, "local_blocks"_a = 1, "max_blocks"_a = -1,
      "workspace"_a = nb::none(), "stream"_a = 0, "num_threads"_a = 0, "check"_a = nb::none(),
      "Block scores of every (token, KV head) and the top-k selection into `topk` ([num_tokens, "
      "num_kv_heads, topk] int32; -1 past a row's valid entries). CUDA: max_blocks (-1: the block "
      "table's columns) bounds ceil(seq_len / 128), and the workspace holds the scores afterwards.");
#if MSA_HAVE_CUDA
  m.def(
      "index_workspace_bytes",
      [](std::int32_t num_tokens, std::int32_t num_kv_heads, std::int32_t max_blocks, const OptString& index_dtype,
         std::int32_t num_prefill_requests) {
        const DType dtype = index_dtype ? parse_dtype(*index_dtype, "index_dtype") : DType::bf16;
        return cuda::index_workspace_bytes(num_tokens, num_kv_heads, max_blocks, dtype, num_prefill_requests);
      },
      "num_tokens"_a, "num_kv_heads"_a, "max_blocks"_a, nb::kw_only(), "index_dtype"_a = nb::none(),
      "num_prefill_requests"_a = 0,
      "Device bytes index() needs as workspace: the block scores [num_tokens, num_kv_heads, max_blocks] fp32, "
      "and for an nvfp4 index cache the room to widen the keys of num_prefill_requests prefill requests once.");
#endif
}

}  // namespace msa::py
