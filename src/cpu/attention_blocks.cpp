#include "cpu/attention_blocks.hpp"

#include <algorithm>
#include <cstring>

#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu::attn {

namespace {

// Decoding tables of the narrow formats (built once, from msa/numeric.hpp).
struct Tables {
  float e4m3[256];
  float e5m2[256];
  float e2m1[16];
  std::vector<float> fp16;  // [65536]
};

const Tables& tables() {
  static const Tables t = [] {
    Tables x;
    for (int c = 0; c < 256; ++c) {
      x.e4m3[c] = num::e4m3_to_float(std::uint8_t(c));
      x.e5m2[c] = num::e5m2_to_float(std::uint8_t(c));
    }
    for (int c = 0; c < 16; ++c) x.e2m1[c] = num::e2m1_to_float(std::uint8_t(c));
    x.fp16.resize(65536);
    for (int c = 0; c < 65536; ++c) x.fp16[c] = num::fp16_to_float(std::uint16_t(c));
    return x;
  }();
  return t;
}

// Dequant scale of token `token` of (page, head), K (is_v 0) or V.
float token_scale(const KVCacheView& c, std::int64_t page, std::int32_t head, std::int32_t token,
                  int is_v) {
  switch (c.scale_mode) {
    case ScaleMode::none: return 1.0f;
    case ScaleMode::per_tensor: return is_v ? c.v_scale : c.k_scale;
    case ScaleMode::per_token_head: {
      const float* s = is_v ? c.v_scales : c.k_scales;  // [num_pages * 128, num_kv_heads]
      return s[c.scale_index(page, head, token)];
    }
  }
  return 1.0f;
}

// bf16 / fp16 / fp8 rows: element (token, d) at base[offset(page, head, token, d)].
template <typename Code, typename Decode>
void load_strided(const KVCacheView& c, std::int64_t page, std::int32_t head, std::int32_t rows,
                  Decode decode, Block& out) {
  const auto* k = static_cast<const Code*>(c.k);
  const auto* v = static_cast<const Code*>(c.v);
  for (std::int32_t t = 0; t < rows; ++t) {
    const std::int64_t at = c.offset(page, head, t, 0);
    const Code* kr = k + at;  // [128]
    const Code* vr = v + at;  // [128]
    const float ks = token_scale(c, page, head, t, 0);
    const float vs = token_scale(c, page, head, t, 1);
    for (int d = 0; d < kHeadDim; ++d) out.kt[d][t] = decode(kr[d]) * ks;
    for (int d = 0; d < kHeadDim; ++d) out.v[t][d] = decode(vr[d]) * vs;
  }
}

// nvfp4 head-slot rows (contract 4.3): one token's 64 data bytes, 8 group scales.
//   dst(t, d) receives element d of token t
template <typename Store>
void load_nvfp4_slot(const KVCacheView& c, std::int64_t page, std::int32_t head, int is_v,
                     std::int32_t rows, Store store) {
  const Tables& tab = tables();
  const auto* slot = static_cast<const std::uint8_t*>(c.k) + nvfp4::slot_offset(c, page, head, is_v);
  const float global = is_v ? c.v_scale : c.k_scale;
  constexpr int kGroups = kHeadDim / nvfp4::kGroup;
  for (std::int32_t t = 0; t < rows; ++t) {
    float group_scale[kGroups];
    for (int g = 0; g < kGroups; ++g) group_scale[g] = tab.e4m3[slot[nvfp4::scale_offset(t, g)]] * global;
    const std::uint8_t* data = slot + nvfp4::data_offset(t, 0);  // [64]
    for (int i = 0; i < kHeadDim / 2; ++i) {
      const float s = group_scale[(2 * i) / nvfp4::kGroup];
      store(t, 2 * i, tab.e2m1[data[i] & 0xF] * s);
      store(t, 2 * i + 1, tab.e2m1[data[i] >> 4] * s);
    }
  }
}

}  // namespace

void load_block(const KVCacheView& c, std::int64_t page, std::int32_t head, std::int32_t rows,
                Block& out) {
  const Tables& tab = tables();
  switch (c.dtype) {
    case DType::bf16:
      load_strided<std::uint16_t>(c, page, head, rows,
                                  [](std::uint16_t x) { return num::bf16_to_float(x); }, out);
      break;
    case DType::fp16:
      load_strided<std::uint16_t>(c, page, head, rows,
                                  [&](std::uint16_t x) { return tab.fp16[x]; }, out);
      break;
    case DType::fp8_e4m3:
      load_strided<std::uint8_t>(c, page, head, rows, [&](std::uint8_t x) { return tab.e4m3[x]; },
                                 out);
      break;
    case DType::fp8_e5m2:
      load_strided<std::uint8_t>(c, page, head, rows, [&](std::uint8_t x) { return tab.e5m2[x]; },
                                 out);
      break;
    case DType::nvfp4:
      load_nvfp4_slot(c, page, head, 0, rows, [&](int t, int d, float x) { out.kt[d][t] = x; });
      load_nvfp4_slot(c, page, head, 1, rows, [&](int t, int d, float x) { out.v[t][d] = x; });
      break;
    default: fail("cpu::attend: cache dtype ", dtype_name(c.dtype), " is not a KV cache dtype");
  }
  // Zero the tokens past `rows` so that whole-chunk arithmetic stays finite.
  for (int d = 0; d < kHeadDim; ++d) std::fill(out.kt[d] + rows, out.kt[d] + kBlockSize, 0.0f);
  for (int t = rows; t < kBlockSize; ++t) std::fill(out.v[t], out.v[t] + kHeadDim, 0.0f);
  out.page = page;
  out.head = head;
  out.rows = rows;
}

const Block& BlockCache::get(std::int64_t page, std::int32_t head, std::int32_t rows) {
  ++clock_;
  Block* victim = nullptr;
  for (auto& b : blocks_) {
    if (b->page == page && b->head == head) {
      if (b->rows < rows) load_block(cache_, page, head, rows, *b);
      b->last_use = clock_;
      return *b;
    }
    if (!victim || b->last_use < victim->last_use) victim = b.get();
  }
  if (int(blocks_.size()) < capacity_) {
    blocks_.push_back(std::make_unique<Block>());
    victim = blocks_.back().get();
  }
  load_block(cache_, page, head, rows, *victim);
  victim->last_use = clock_;
  return *victim;
}

std::unique_ptr<BlockCache> BlockCachePool::acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      auto c = std::move(free_.back());
      free_.pop_back();
      return c;
    }
  }
  return std::make_unique<BlockCache>(cache_, capacity_);
}

void BlockCachePool::release(std::unique_ptr<BlockCache> c) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(c));
}

}  // namespace msa::cpu::attn
