// Stub: owner fills in.
#include "core/checks.hpp"
namespace msa::check {
void cache_view(const KVCacheView&) {}
void index_cache_view(const IndexCacheView&) {}
void insert_kv_shape(const KVCacheView&, const InsertKVArgs&) {}
void insert_index_shape(const IndexCacheView&, const InsertIndexArgs&) {}
void slots_data(const std::int64_t*, std::int64_t, std::int64_t, const char*) {}
}  // namespace msa::check
