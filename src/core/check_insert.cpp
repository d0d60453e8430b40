// Input checks of the insert operations (contract 8): argument shapes and
// dtypes, the views of the cache and the sources, and slot values. Every
// message names the argument, the index and the value.
#include <cstdint>

#include "core/checks.hpp"
#include "msa/error.hpp"

namespace msa::check {

namespace {

// The int64 slot array of an insert.   slots: [num_tokens]
Span slots_view(const std::int64_t* slots, std::int64_t num_tokens) {
  aligned("slots", slots, sizeof(std::int64_t), "int64 entries");
  return span_at("slots", slots, size_of("slots", num_tokens, sizeof(std::int64_t)));
}

}  // namespace

void insert_kv_shape(const KVCacheView& cache, const InsertKVArgs& args) {
  cache_view(cache);
  MSA_CHECK(args.num_tokens >= 0, "num_tokens = ", args.num_tokens, " must be >= 0");
  MSA_CHECK(is_half(args.src_dtype), "src_dtype = ", dtype_name(args.src_dtype),
            " is not an insert source dtype (expected bf16 or fp16)");
  if (args.num_tokens == 0) return;
  MSA_CHECK(args.k != nullptr, "k is null with num_tokens = ", args.num_tokens);
  MSA_CHECK(args.v != nullptr, "v is null with num_tokens = ", args.num_tokens);
  MSA_CHECK(args.slots != nullptr, "slots is null with num_tokens = ", args.num_tokens);
  const std::int64_t rows = size_of("k", args.num_tokens, std::int64_t(cache.num_kv_heads) * kHeadDim);
  const Span sources[] = {dense_view(args.k, args.src_dtype, rows, "k"),
                          dense_view(args.v, args.src_dtype, rows, "v"),
                          slots_view(args.slots, args.num_tokens)};
  const CacheSpans written = cache_spans(cache);
  for (const Span& s : sources) {
    for (const Span* w : {&written.k, &written.v, &written.k_scales, &written.v_scales}) no_overlap(*w, s);
  }
}

void insert_index_shape(const IndexCacheView& cache, const InsertIndexArgs& args) {
  index_cache_view(cache);
  MSA_CHECK(args.num_tokens >= 0, "num_tokens = ", args.num_tokens, " must be >= 0");
  MSA_CHECK(is_half(args.src_dtype), "src_dtype = ", dtype_name(args.src_dtype),
            " is not an index-key source dtype (expected bf16 or fp16)");
  if (args.num_tokens == 0) return;
  MSA_CHECK(args.index_k != nullptr, "index_k is null with num_tokens = ", args.num_tokens);
  MSA_CHECK(args.slots != nullptr, "slots is null with num_tokens = ", args.num_tokens);
  const Span written = index_cache_span(cache);
  no_overlap(written, dense_view(args.index_k, args.src_dtype,
                                 size_of("index_k", args.num_tokens, kHeadDim), "index_k"));
  no_overlap(written, slots_view(args.slots, args.num_tokens));
}

void slots_data(const std::int64_t* slots, std::int64_t num_tokens, std::int64_t num_pages,
                const char* what) {
  if (num_tokens <= 0) return;
  MSA_CHECK(slots != nullptr, what, " is null with num_tokens = ", num_tokens);
  const std::int64_t limit = num_pages * kBlockSize;
  for (std::int64_t i = 0; i < num_tokens; ++i) {
    MSA_CHECK(slots[i] < limit, what, "[", i, "] = ", slots[i], " but the cache has ", num_pages,
              " pages (", limit, " slots)");
  }
}

}  // namespace msa::check
