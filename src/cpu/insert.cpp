// Stub: owner fills in.
#include "msa/cpu.hpp"
#include "msa/error.hpp"
namespace msa::cpu {
void insert_kv(const KVCacheView&, const InsertKVArgs&, const Options&) { fail("cpu::insert_kv: not implemented yet"); }
void insert_index(const IndexCacheView&, const InsertIndexArgs&, const Options&) { fail("cpu::insert_index: not implemented yet"); }
}  // namespace msa::cpu
