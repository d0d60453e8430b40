// Checks of the small views every operation shares (contract 8): block
// tables, top-k buffers and dense arrays (queries, outputs, sources). Each
// returns the memory the view declares, for the overlap checks of the
// operations. Reads addresses only.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

// Whether the rows data[t * token_stride + h * head_stride + (0 .. len)] for
// t < num_tokens, h < num_heads are pairwise disjoint: with the dimensions of
// more than one row sorted by stride, each stride must clear everything the
// inner dimensions span. (Strides are not negative here.)
bool rows_disjoint(std::int64_t num_tokens, std::int64_t token_stride, std::int64_t num_heads,
                   std::int64_t head_stride, std::int64_t len) {
  struct Dim {
    std::int64_t count, stride;
  };
  Dim dims[2];
  int n = 0;
  if (num_tokens > 1) dims[n++] = {num_tokens, token_stride};
  if (num_heads > 1) dims[n++] = {num_heads, head_stride};
  std::sort(dims, dims + n, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  __int128 span = len;
  for (int i = 0; i < n; ++i) {
    if (dims[i].stride < span) return false;
    span += __int128(dims[i].stride) * (dims[i].count - 1);
  }
  return true;
}

}  // namespace

Span block_table_view(const BlockTable& t, std::int64_t num_requests, std::int64_t num_pages,
                      const char* what) {
  MSA_CHECK(t.num_rows >= num_requests, what, ".num_rows = ", t.num_rows, " but the step has ",
            num_requests, " requests");
  MSA_CHECK(t.max_blocks >= 0, what, ".max_blocks = ", t.max_blocks, " is negative");
  MSA_CHECK(t.num_rows <= 1 || t.row_stride >= t.max_blocks, what, ".row_stride = ", t.row_stride,
            " is below max_blocks = ", t.max_blocks, " (rows would overlap)");
  aligned(what, t.data, sizeof(std::int32_t), "int32 entries");
  const bool read = num_requests > 0 && t.max_blocks > 0 && num_pages > 0;
  MSA_CHECK(!read || t.data != nullptr, what, ".data is null but the table has ", num_requests,
            " requests x ", t.max_blocks, " columns over a cache of ", num_pages, " pages");
  if (t.data == nullptr || t.num_rows <= 0 || t.max_blocks == 0) return Span{what, 0, 0};
  const std::int64_t row_stride = t.num_rows > 1 ? t.row_stride : 0;
  const std::int64_t entries = size_of(what, t.num_rows - 1, row_stride, t.max_blocks);
  return span_at(what, t.data, size_of(what, entries, sizeof(std::int32_t)));
}

Span topk_view(const TopkView& v, std::int64_t num_tokens, std::int64_t num_kv_heads, const char* what) {
  MSA_CHECK(v.topk >= 1 && v.topk <= kMaxTopk, what, ".topk = ", v.topk, " is outside [1, ", kMaxTopk, "]");
  MSA_CHECK(num_tokens <= 0 || v.data != nullptr, what, ".data is null but the step has ", num_tokens,
            " tokens");
  aligned(what, v.data, sizeof(std::int32_t), "int32 entries");
  if (num_tokens <= 0 || num_kv_heads <= 0) return Span{what, 0, 0};
  MSA_CHECK(num_tokens == 1 || v.token_stride >= 0, what, ".token_stride = ", v.token_stride,
            " is negative (", num_tokens, " tokens)");
  MSA_CHECK(num_kv_heads == 1 || v.head_stride >= 0, what, ".head_stride = ", v.head_stride,
            " is negative (", num_kv_heads, " KV heads)");
  MSA_CHECK(rows_disjoint(num_tokens, v.token_stride, num_kv_heads, v.head_stride, v.topk), what,
            " rows overlap: token_stride = ", v.token_stride, ", head_stride = ", v.head_stride, " for ",
            num_tokens, " tokens x ", num_kv_heads, " KV heads of topk = ", v.topk);
  const std::int64_t last_row =
      size_of(what, num_tokens - 1, num_tokens > 1 ? v.token_stride : 0,
              size_of(what, num_kv_heads - 1, num_kv_heads > 1 ? v.head_stride : 0));
  const std::int64_t entries = size_of(what, 1, last_row, v.topk);
  return span_at(what, v.data, size_of(what, entries, sizeof(std::int32_t)));
}

Span dense_view(const void* data, DType dtype, std::int64_t count, const char* what, bool optional) {
  MSA_CHECK(count >= 0, what, " has ", count, " elements");
  if (data == nullptr) {
    MSA_CHECK(optional || count == 0, what, " is null but holds ", count, " elements");
    return Span{what, 0, 0};
  }
  const std::int64_t eb = dtype == DType::nvfp4 ? 1 : std::int64_t(dtype_bytes(dtype));
  MSA_CHECK(eb > 0, what, " has dtype ", dtype_name(dtype), ", which has no element size");
  aligned(what, data, eb, dtype_name(dtype));
  return span_at(what, data, size_of(what, count, eb));
}

}  // namespace msa::check
