#include "qkv_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa {

namespace {

std::uint64_t hash(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) from (seed, stream, index).
double uniform_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  return double(hash(hash(seed ^ (stream * 0xD1B54A32D192ED03ull)) ^ i) >> 11) * 0x1p-53;
}

float decode(DType t, const std::uint8_t* base, std::int64_t i) {
  switch (t) {
    case DType::bf16: {
      std::uint16_t b;
      std::memcpy(&b, base + 2 * i, 2);
      return num::bf16_to_float(b);
    }
    case DType::fp16: {
      std::uint16_t b;
      std::memcpy(&b, base + 2 * i, 2);
      return num::fp16_to_float(b);
    }
    case DType::fp8_e4m3: return num::e4m3_to_float(base[i]);
    default: fail("qkv step: cannot read dtype ", dtype_name(t));
  }
}

void encode(DType t, float x, std::uint8_t* out) {
  const std::uint16_t b = t == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
  std::memcpy(out, &b, 2);
}

}  // namespace

QkvStep make_qkv_step(Workload& w, double rope_theta) {
  const ModelConfig& m = w.model();
  const std::int64_t T = w.num_tokens(), nq = m.num_q_heads, H = m.num_kv_heads, D = kHeadDim;
  const std::int64_t heads = nq + 3 * H + 1;
  const DType src = w.src_dtype(), qt = w.spec().q_dtype;
  const std::uint64_t seed = w.spec().seed;
  QkvStep s;
  s.qkv.resize(std::size_t(T * heads * D * 2));
  // Head j of token i as a source row: the workload's values at gain g.
  auto put = [&](std::int64_t i, std::int64_t j, DType t, const std::uint8_t* base, std::int64_t first,
                 float scale) {
    const float g = float(std::exp(-1.5 + 3.0 * uniform_at(seed, 1, std::uint64_t(i * heads + j))));
    for (std::int64_t d = 0; d < D; ++d)
      encode(src, g * scale * decode(t, base, first + d), s.qkv.data() + ((i * heads + j) * D + d) * 2);
  };
  const float q_dequant = qt == DType::fp8_e4m3 ? w.q_scale : 1.0f;
  for (std::int64_t i = 0; i < T; ++i) {
    for (std::int64_t h = 0; h < nq; ++h) put(i, h, qt, w.q.data(), (i * nq + h) * D, q_dequant);
    for (std::int64_t h = 0; h < H; ++h) {
      put(i, nq + h, src, w.new_k.data(), (i * H + h) * D, 1.0f);
      put(i, nq + 2 * H + h, src, w.index_q.data(), (i * H + h) * D, 1.0f);
    }
    put(i, nq + 3 * H, src, w.new_index_k.data(), i * D, 1.0f);
  }
  // V heads keep the workload's values as they are.
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t h = 0; h < H; ++h)
      std::memcpy(s.qkv.data() + ((i * heads + nq + H + h) * D) * 2, w.new_v.data() + ((i * H + h) * D) * 2, D * 2);
  s.weights.resize(std::size_t(4 * D));
  for (std::size_t k = 0; k < s.weights.size(); ++k) {
    const double u1 = uniform_at(seed, 2, 2 * k) + 0x1p-54, u2 = uniform_at(seed, 2, 2 * k + 1);
    s.weights[k] = float(0.2 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  s.positions.resize(std::size_t(T));
  for (std::int64_t i = 0; i < T; ++i)
    s.positions[std::size_t(i)] = std::max(w.meta().token_position[std::size_t(i)], 0);
  s.max_position = 1 + *std::max_element(s.positions.begin(), s.positions.end());
  s.cos_sin.resize(std::size_t(s.max_position * kRopeDims));
  make_rope_table(rope_theta, s.max_position, s.cos_sin.data());
  if (qt == DType::fp8_e4m3) w.q_scale *= 1.5f;
  return s;
}

double qkv_step_bytes(const WorkloadSpec& spec) {
  const double heads = spec.model.num_q_heads + 3.0 * spec.model.num_kv_heads + 1;
  double tokens = 0, max_position = 1;
  for (const RequestShape& r : spec.requests) {
    tokens += r.query_len;
    if (r.query_len > 0) max_position = std::max(max_position, double(r.query_len) + r.context_len);
  }
  return tokens * (heads * kHeadDim * 2 + sizeof(std::int64_t)) + 4.0 * kHeadDim * sizeof(float) +
         max_position * kRopeDims * sizeof(float);
}

PreAttentionArgs QkvStep::args(Workload& w) const {
  const ModelConfig& m = w.model();
  PreAttentionArgs a;
  a.qkv = qkv.data();
  a.qkv_dtype = w.src_dtype();
  a.num_tokens = w.num_tokens();
  a.num_q_heads = m.num_q_heads;
  a.num_kv_heads = m.num_kv_heads;
  a.num_index_heads = m.num_kv_heads;
  a.positions = positions.data();
  a.q_weight = weights.data();
  a.k_weight = weights.data() + kHeadDim;
  a.index_q_weight = weights.data() + 2 * kHeadDim;
  a.index_k_weight = weights.data() + 3 * kHeadDim;
  a.weight_dtype = DType::f32;
  a.eps = kM3NormEps;
  a.cos_sin = cos_sin.data();
  a.cos_sin_dtype = DType::f32;
  a.max_position = max_position;
  a.q = w.q.data();
  a.q_dtype = w.spec().q_dtype;
  a.q_scale = w.q_scale;
  a.index_q = w.spec().fp8_index_query ? w.index_q_e4m3.data() : w.index_q.data();
  a.index_q_dtype = w.spec().fp8_index_query ? DType::fp8_e4m3 : w.src_dtype();
  a.slots = w.slots.data();
  a.index_slots = w.index_slots.data();
  return a;
}

PreAttentionArgs QkvStep::twin_args(Workload& w) const {
  PreAttentionArgs a = args(w);
  a.index_q = w.index_q.data();
  a.index_q_dtype = w.src_dtype();
  return a;
}

}  // namespace msa
