#include "pre_attention_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::test {

namespace {

constexpr int D = kHeadDim;

std::uint16_t encode_half(DType t, float x) {
  return t == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
}

// Values of an f32 / bf16 / fp16 array, as bytes.
std::vector<std::uint8_t> encode_table(const std::vector<float>& x, DType t) {
  std::vector<std::uint8_t> out(x.size() * dtype_bytes(t));
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const std::uint16_t b = encode_half(t, x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

// Random numbers from the raw mt19937_64 stream (fully specified by the
// standard, unlike the <random> distributions), so a case's data is the same
// with every standard library.
double uniform(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1p-53; }
float normal(std::mt19937_64& rng) {
  const double u1 = (double(rng() >> 11) + 1.0) * 0x1p-53;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * uniform(rng)));
}

// Distinct shuffled slots of `pages` pages, about one in six negative.
std::vector<std::int64_t> random_slots(std::int64_t n, std::int64_t pages, std::mt19937_64& rng) {
  std::vector<std::int64_t> all(std::size_t(pages * kBlockSize));
  std::iota(all.begin(), all.end(), 0);
  for (std::size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng() % i]);
  std::vector<std::int64_t> s(all.begin(), all.begin() + n);
  for (auto& x : s)
    if (rng() % 6 == 0) x = -1 - std::int64_t(rng() % 300);
  return s;
}

}  // namespace

std::string PreAttentionCase::name() const {
  std::string kv_name = dtype_name(kv);
  if (is_fp8(kv)) kv_name += scales == ScaleMode::per_token_head ? "/token" : "/tensor";
  return detail::concat("src=", dtype_name(src), " kv=", kv_name, " ",
                        kv == DType::nvfp4 ? "slots" : layout_name(layout), "+", page_pad,
                        " index=", dtype_name(index), " q=", dtype_name(q), " iq=", dtype_name(iq),
                        " w=", dtype_name(weight), " cs=", dtype_name(table), " heads=", nq, "/", nkv,
                        "/", niq, " tokens=", tokens, " row_pad=", row_pad,
                        own_index_slots ? " own index slots" : " shared slots", " seed=", seed);
}

KVCacheView PreAttentionInputs::view(void* base, float* k_scales_at, float* v_scales_at) const {
  if (c.kv == DType::nvfp4) {
    const std::int64_t compact = 2 * std::int64_t(c.nkv) * nvfp4::kSlotBytes;
    return make_nvfp4_cache_view(base, pages, c.nkv, 1.0f / 128.0f, 1.0f / 32.0f,
                                 c.page_pad ? compact + c.page_pad : 0);
  }
  const std::int64_t compact = std::int64_t(c.nkv) * kBlockSize * 2 * D;
  KVCacheView v = make_cache_view(c.kv, base, pages, c.nkv, c.layout, c.page_pad ? compact + c.page_pad : 0);
  v.scale_mode = c.scales;
  if (c.scales == ScaleMode::per_tensor) {
    v.k_scale = 1.0f / 64.0f;
    v.v_scale = 1.0f / 16.0f;
  } else if (c.scales == ScaleMode::per_token_head) {
    v.k_scales = k_scales_at;
    v.v_scales = v_scales_at;
  }
  return v;
}

IndexCacheView PreAttentionInputs::index_view(void* base) const {
  return make_index_cache_view(c.index, base, index_pages, 0, c.index == DType::nvfp4 ? 1.0f / 32.0f : 1.0f);
}

PreAttentionArgs PreAttentionInputs::args() {
  PreAttentionArgs a;
  a.qkv = qkv.data();
  a.qkv_dtype = c.src;
  a.qkv_row_stride = c.row_pad ? stride() : 0;
  a.num_tokens = c.tokens;
  a.num_q_heads = c.nq;
  a.num_kv_heads = c.nkv;
  a.num_index_heads = c.niq;
  a.positions = positions.data();
  a.q_weight = weights[0].data();
  a.k_weight = weights[1].data();
  a.index_q_weight = weights[2].data();
  a.index_k_weight = weights[3].data();
  a.weight_dtype = c.weight;
  a.cos_sin = cos_sin.data();
  a.cos_sin_dtype = c.table;
  a.max_position = max_position;
  a.q = q.data();
  a.q_dtype = c.q;
  a.q_scale = 1.0f / 32.0f;
  a.index_q = iq.data();
  a.index_q_dtype = c.iq;
  a.slots = slots.data();
  a.index_slots = c.own_index_slots ? index_slots.data() : nullptr;
  return a;
}

PreAttentionInputs make_pre_attention_inputs(const PreAttentionCase& c) {
  PreAttentionInputs in;
  in.c = c;
  std::mt19937_64 rng(c.seed);
  const std::int64_t T = c.tokens, H = in.heads();
  in.qkv.assign(std::size_t(T * in.stride()), std::uint16_t{0x7FFF});  // NaN in the row padding
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t j = 0; j < H; ++j) {
      const float gain = float(std::exp(-2.0 + 4.5 * uniform(rng)));
      for (int d = 0; d < D; ++d)
        in.qkv[std::size_t(i * in.stride() + j * D + d)] = encode_half(c.src, gain * normal(rng));
    }
  // Special heads: an all-zero q head, a K head holding a NaN, a q head with a
  // huge value; a q head holding a NaN and an index q head holding an infinity
  // (its norm factor is 0, so that element becomes NaN and the rest 0), which
  // reach the 16-bit q outputs, whose NaN code the contract fixes.
  auto at = [&](std::int64_t i, std::int64_t j, int d) -> std::uint16_t& {
    return in.qkv[std::size_t(i * in.stride() + j * D + d)];
  };
  for (int d = 0; d < D; ++d) at(0, 0, d) = encode_half(c.src, 0.0f);
  if (T > 2) {
    at(1, c.nq, 3) = encode_half(c.src, std::numeric_limits<float>::quiet_NaN());
    at(2, 0, 70) = encode_half(c.src, 3.0e4f);
    at(1, c.nq > 1 ? 1 : 0, 90) = encode_half(c.src, std::numeric_limits<float>::quiet_NaN());
    at(2, c.nq + 2 * c.nkv, 10) = encode_half(c.src, std::numeric_limits<float>::infinity());
  }
  for (auto& w : in.weights) {
    std::vector<float> f(D);
    for (float& x : f) x = 0.5f * normal(rng);
    w = encode_table(f, c.weight);
  }
  in.max_position = 3000 + std::int64_t(rng() % 2000);
  std::vector<float> table(std::size_t(in.max_position * kRopeDims));
  make_rope_table(kM3RopeTheta, in.max_position, table.data());
  in.cos_sin = encode_table(table, c.table);
  in.positions.resize(std::size_t(T));
  for (auto& p : in.positions) p = std::int64_t(rng() % std::uint64_t(in.max_position));
  if (T > 0) in.positions[0] = in.max_position - 1;
  if (T > 1) in.positions[1] = 0;

  in.pages = (T + kBlockSize - 1) / kBlockSize + 2;
  in.index_pages = in.pages + 1;
  in.slots = random_slots(T, in.pages, rng);
  in.index_slots = random_slots(T, in.index_pages, rng);

  const std::size_t eb = c.kv == DType::nvfp4 ? 1 : dtype_bytes(c.kv);
  const KVCacheView probe = in.view(reinterpret_cast<void*>(std::uintptr_t{4096}), nullptr, nullptr);
  in.cache.assign(std::size_t(cache_extent(probe)) * eb + kPreAttentionGuard, kPreAttentionPoison);
  in.index_cache.assign(std::size_t(in.index_pages * index_page_bytes(c.index)) + kPreAttentionGuard,
                        kPreAttentionPoison);
  const std::size_t scales = std::size_t(in.pages * kBlockSize * c.nkv);
  in.k_scales.assign(scales, std::numeric_limits<float>::quiet_NaN());
  in.v_scales.assign(scales, std::numeric_limits<float>::quiet_NaN());
  in.q.assign(std::size_t(T * c.nq * D) * dtype_bytes(c.q), kPreAttentionPoison);
  in.iq.assign(std::size_t(T * c.niq * D) * dtype_bytes(c.iq), kPreAttentionPoison);
  return in;
}

}  // namespace msa::test
