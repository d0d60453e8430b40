// Synthetic pre-attention calls for the tests and `msa check`: the qkv rows
// (random heads at random gains, an all-zero head, a NaN and a huge value),
// norm weights, the rope table of MiniMax-M3's theta, positions, shuffled
// slots with skips, and poisoned caches and outputs with a guard past them.
// Everything is a pure function of the case.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "msa/cache.hpp"
#include "msa/dtype.hpp"
#include "msa/pre_attention.hpp"

namespace msa::test {

struct PreAttentionCase {
  DType src = DType::bf16;               // qkv dtype
  DType kv = DType::bf16;                // KV cache dtype
  ScaleMode scales = ScaleMode::none;    // fp8: per_tensor or per_token_head
  Layout layout = Layout::hnd;           // not nvfp4
  std::int64_t page_pad = 0;             // elements (bytes for nvfp4) past a compact page
  DType index = DType::bf16;             // index cache dtype (nvfp4: global scale 1/32)
  DType q = DType::bf16;                 // q output dtype
  DType iq = DType::bf16;                // index q output dtype
  DType weight = DType::f32;             // norm weight dtype
  DType table = DType::f32;              // cos/sin dtype
  int nq = 16, nkv = 1, niq = 1;
  std::int64_t tokens = 37;
  std::int64_t row_pad = 0;              // extra elements per qkv row
  bool own_index_slots = true;           // else index_slots is null (the main slots)
  std::uint64_t seed = 1;

  std::string name() const;
};

inline constexpr std::uint8_t kPreAttentionPoison = 0xA5;
inline constexpr std::size_t kPreAttentionGuard = 512;  // bytes past each cache

// Everything one call reads and writes, in host memory.
struct PreAttentionInputs {
  PreAttentionCase c;
  std::int64_t pages = 0, index_pages = 0, max_position = 0;
  std::vector<std::uint16_t> qkv;             // [tokens, stride()] src
  std::vector<std::uint8_t> weights[4];       // [128] each (q, k, index q, index k), c.weight
  std::vector<std::uint8_t> cos_sin;          // [max_position, 64] c.table
  std::vector<std::int64_t> positions;        // [tokens]
  std::vector<std::int64_t> slots;            // [tokens], some negative
  std::vector<std::int64_t> index_slots;      // [tokens], some negative
  std::vector<std::uint8_t> cache;            // the KV cache's extent plus the guard, poisoned
  std::vector<std::uint8_t> index_cache;      // index_pages compact pages of c.index plus the guard, poisoned
  std::vector<float> k_scales, v_scales;      // [pages * 128, nkv] NaN (per_token_head)
  std::vector<std::uint8_t> q, iq;            // [tokens, nq * 128] c.q, [tokens, niq * 128] c.iq, poisoned

  std::int64_t heads() const { return std::int64_t(c.nq) + 2 * c.nkv + c.niq + 1; }
  std::int64_t stride() const { return heads() * kHeadDim + c.row_pad; }
  // Bytes of the cache extent (without the guard).
  std::size_t cache_bytes() const { return cache.size() - kPreAttentionGuard; }

  // The views and arguments over these buffers, or over copies of them
  // elsewhere (pass the copies' base pointers).
  KVCacheView view(void* base, float* k_scales_at, float* v_scales_at) const;
  IndexCacheView index_view(void* base) const;
  PreAttentionArgs args();
};

PreAttentionInputs make_pre_attention_inputs(const PreAttentionCase& c);

}  // namespace msa::test
