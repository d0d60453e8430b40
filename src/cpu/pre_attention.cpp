// The CPU engine's pre-attention (msa/pre_attention.hpp, contract 10): norm and
// RoPE per head in fp32 (src/core/pre_attention_math.hpp), the unquantized
// values rounded to the qkv dtype, q and index q stored from them, and K, V and
// the index key handed to cpu::insert_kv / insert_index as source rows, so
// that the caches hold exactly what the inserts write (every cache dtype,
// layout and scale mode, present and future).
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/check_pre_attention.hpp"
#include "core/pre_attention_math.hpp"
#include "cpu/parallel.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cpu {

namespace {

constexpr std::int64_t kGrain = 8;  // tokens per parallel_for chunk

// Element i of an f32, bf16 or fp16 array.
float load_value(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::bf16: return num::bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    default: return num::fp16_to_float(static_cast<const std::uint16_t*>(p)[i]);
  }
}

//   out: [n]
void load_values(const void* p, DType t, int n, float* out) {
  for (int i = 0; i < n; ++i) out[i] = load_value(p, t, i);
}

std::uint16_t encode_half(DType t, float x) {
  return t == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
}

// u = z rounded to the qkv dtype (step 3 of the SEMANTICS).
//   z, u: [128]
void round_head(DType src, const float* z, float* u) {
  for (int d = 0; d < kHeadDim; ++d) {
    const std::uint16_t b = encode_half(src, z[d]);
    u[d] = src == DType::bf16 ? num::bf16_to_float(b) : num::fp16_to_float(b);
  }
}

//   z: [128]   out: [128] qkv-dtype bits
void encode_head(DType src, const float* z, std::uint16_t* out) {
  for (int d = 0; d < kHeadDim; ++d) out[d] = encode_half(src, z[d]);
}

// One head of 128 values into a bf16, fp16 or fp8 e4m3 output row (e4m3:
// x / scale, saturating).
//   dst: [128] of dtype
void store_head(const float* x, DType dtype, float scale, void* dst) {
  if (dtype == DType::fp8_e4m3) {
    auto* o = static_cast<std::uint8_t*>(dst);
    for (int d = 0; d < kHeadDim; ++d) o[d] = num::float_to_e4m3(x[d] / scale);
  } else {
    auto* o = static_cast<std::uint16_t*>(dst);
    for (int d = 0; d < kHeadDim; ++d) o[d] = encode_half(dtype, x[d]);
  }
}

}  // namespace

void pre_attention(const KVCacheView& cache, const IndexCacheView& index_cache,
                   const PreAttentionArgs& a, const Options& opt) {
  check_options(opt);
  check::pre_attention_shape(cache, index_cache, a);
  if (opt.check) check::pre_attention_data(cache, index_cache, a);
  const std::int64_t N = a.num_tokens;
  if (N <= 0) return;
  const std::int64_t nq = a.num_q_heads, nkv = a.num_kv_heads, niq = a.num_index_heads;
  const std::int64_t heads = a.heads_per_token(), stride = a.row_stride();
  const DType src = a.qkv_dtype;

  // Norm weights by head kind (V has none).
  float weights[4][kHeadDim];
  const void* weight_ptr[4] = {a.q_weight, a.k_weight, a.index_q_weight, a.index_k_weight};
  for (int k = 0; k < 4; ++k) load_values(weight_ptr[k], a.weight_dtype, kHeadDim, weights[k]);

  // The inserts' source rows: u of K, V and the index key, in the qkv dtype.
  std::vector<std::uint16_t> k_rows(std::size_t(N * nkv * kHeadDim));
  std::vector<std::uint16_t> v_rows(k_rows.size());
  std::vector<std::uint16_t> ik_rows(std::size_t(N * kHeadDim));
  std::vector<std::int64_t> kv_slots(static_cast<std::size_t>(N)), ik_slots(kv_slots.size());
  const std::size_t q_eb = dtype_bytes(a.q_dtype), iq_eb = dtype_bytes(a.index_q_dtype);
  const auto* qkv = static_cast<const std::uint16_t*>(a.qkv);

  parallel_for(N, opt.num_threads, kGrain, [&](std::int64_t begin, std::int64_t end) {
    float x[kHeadDim], z[kHeadDim], u[kHeadDim], cs[kRopeDims];
    for (std::int64_t i = begin; i < end; ++i) {
      const std::int64_t pos = a.positions[i];
      if (pos < 0 || pos >= a.max_position) {  // (unchecked) the token is skipped whole
        kv_slots[i] = ik_slots[i] = -1;
        continue;
      }
      kv_slots[i] = a.slots[i];
      ik_slots[i] = a.index_slots != nullptr ? a.index_slots[i] : a.slots[i];
      for (int d = 0; d < kRopeDims; ++d) cs[d] = load_value(a.cos_sin, a.cos_sin_dtype, pos * kRopeDims + d);
      for (std::int64_t j = 0; j < heads; ++j) {
        const std::uint16_t* head = qkv + i * stride + j * kHeadDim;
        const pre::HeadKind kind = pre::head_kind(j, nq, nkv, niq);
        if (kind == pre::HeadKind::v) {
          std::memcpy(v_rows.data() + ((i * nkv) + (j - nq - nkv)) * kHeadDim, head,
                      kHeadDim * sizeof(std::uint16_t));
          continue;
        }
        for (int d = 0; d < kHeadDim; ++d)
          x[d] = src == DType::bf16 ? num::bf16_to_float(head[d]) : num::fp16_to_float(head[d]);
        const int w = kind == pre::HeadKind::q ? 0 : kind == pre::HeadKind::k ? 1
                      : kind == pre::HeadKind::index_q ? 2 : 3;
        pre::norm_rope_head(x, weights[w], cs, a.eps, z);
        switch (kind) {
          case pre::HeadKind::q:
            round_head(src, z, u);
            store_head(u, a.q_dtype, a.q_scale,
                       static_cast<std::uint8_t*>(a.q) + (i * nq + j) * kHeadDim * q_eb);
            break;
          case pre::HeadKind::index_q:
            round_head(src, z, u);
            store_head(u, a.index_q_dtype, 1.0f,
                       static_cast<std::uint8_t*>(a.index_q) +
                           (i * niq + (j - nq - 2 * nkv)) * kHeadDim * iq_eb);
            break;
          case pre::HeadKind::k:
            encode_head(src, z, k_rows.data() + (i * nkv + (j - nq)) * kHeadDim);
            break;
          default:
            encode_head(src, z, ik_rows.data() + i * kHeadDim);
            break;
        }
      }
    }
  });

  Options inner = opt;
  inner.check = false;  // checked above (or deliberately not)
  insert_kv(cache, InsertKVArgs{k_rows.data(), v_rows.data(), src, kv_slots.data(), N}, inner);
  insert_index(index_cache, InsertIndexArgs{ik_rows.data(), src, ik_slots.data(), N}, inner);
}

}  // namespace msa::cpu
