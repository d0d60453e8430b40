#include "pre_attention_check.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "cache_reader.hpp"
#include "compare.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"
#include "pre_attention_ref.hpp"

namespace msa::tool {

namespace {

constexpr int D = kHeadDim;

std::uint16_t encode_half(DType t, float x) {
  return t == DType::bf16 ? num::float_to_bf16(x) : num::float_to_fp16(x);
}

// An output row value u as stored in `dtype` and read back (fp8 e4m3: u / scale, times scale).
double stored(DType dtype, float u, float scale) {
  if (dtype == DType::fp8_e4m3) return double(num::e4m3_to_float(num::float_to_e4m3(u / scale))) * scale;
  const std::uint16_t b = encode_half(dtype, u);
  return dtype == DType::bf16 ? num::bf16_to_float(b) : num::fp16_to_float(b);
}

PreAttentionCheck::Output compare_values(const std::string& name, const std::vector<double>& got,
                                         const std::vector<double>& want) {
  PreAttentionCheck::Output o;
  o.name = name;
  o.values = std::int64_t(want.size());
  for (std::size_t i = 0; i < want.size(); ++i) o.differ += got[i] != want[i];
  const ref::Comparison c = ref::compare(got, want, name);
  o.rel = c.mismatches ? std::numeric_limits<double>::infinity() : c.rel_frobenius;
  return o;
}

}  // namespace

const PreAttentionCheck::Output* PreAttentionCheck::worst() const {
  const Output* w = nullptr;
  for (const Output& o : outputs)
    if (w == nullptr || !(o.rel <= w->rel)) w = &o;
  return w;
}

PreAttentionCheck check_pre_attention(Workload& w, const QkvStep& step) {
  PreAttentionCheck r;
  const PreAttentionArgs a = step.args(w);
  const std::int64_t T = a.num_tokens, nq = a.num_q_heads, H = a.num_kv_heads, niq = a.num_index_heads;
  const std::int64_t heads = a.heads_per_token();
  r.tokens = T;
  const ref::PreAttentionRef ref = ref::pre_attention_reference(a);

  // q and index q.
  std::vector<double> got, want;
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t h = 0; h < nq; ++h)
      for (int d = 0; d < D; ++d) {
        want.push_back(stored(a.q_dtype, ref.rounded(i, h, d), a.q_scale));
        got.push_back(ref::read_element(a.q, a.q_dtype, (i * nq + h) * D + d) *
                      (a.q_dtype == DType::fp8_e4m3 ? a.q_scale : 1.0f));
      }
  r.outputs.push_back(compare_values("q", got, want));
  got.clear();
  want.clear();
  for (std::int64_t i = 0; i < T; ++i)
    for (std::int64_t h = 0; h < niq; ++h)
      for (int d = 0; d < D; ++d) {
        want.push_back(stored(a.index_q_dtype, ref.rounded(i, nq + 2 * H + h, d), 1.0f));
        got.push_back(ref::read_element(a.index_q, a.index_q_dtype, (i * niq + h) * D + d));
      }
  r.outputs.push_back(compare_values("index q", got, want));

  // K and V: the oracle's rows through the insert into a scratch cache of the
  // workload's dtype and scales, token i at slot i.
  const DType src = a.qkv_dtype;
  std::vector<std::uint16_t> k_rows(std::size_t(T * H * D)), v_rows(k_rows.size()), ik_rows(std::size_t(T * D));
  for (std::int64_t i = 0; i < T; ++i)
    for (int d = 0; d < D; ++d) {
      for (std::int64_t h = 0; h < H; ++h) {
        k_rows[std::size_t((i * H + h) * D + d)] = encode_half(src, ref.rounded(i, nq + h, d));
        v_rows[std::size_t((i * H + h) * D + d)] = encode_half(src, ref.rounded(i, nq + H + h, d));
      }
      ik_rows[std::size_t(i * D + d)] = encode_half(src, ref.rounded(i, heads - 1, d));
    }
  std::vector<std::int64_t> scratch_slots(static_cast<std::size_t>(T));
  for (std::int64_t i = 0; i < T; ++i) scratch_slots[std::size_t(i)] = i;
  const std::int64_t pages = (T + kBlockSize - 1) / kBlockSize;
  const KVCacheView cache = w.kv_view();
  KVCacheView scratch = cache;
  std::vector<std::uint8_t> scratch_bytes;
  std::vector<float> scratch_ks(std::size_t(pages * kBlockSize * H)), scratch_vs(scratch_ks.size());
  if (cache.dtype == DType::nvfp4) {
    scratch_bytes.resize(std::size_t(pages * 2 * H * nvfp4::kSlotBytes));
    scratch = make_nvfp4_cache_view(scratch_bytes.data(), pages, int(H), cache.k_scale, cache.v_scale);
  } else {
    scratch_bytes.resize(std::size_t(pages * H * kBlockSize * 2 * D) * dtype_bytes(cache.dtype));
    scratch = make_cache_view(cache.dtype, scratch_bytes.data(), pages, int(H), w.spec().layout);
    scratch.scale_mode = cache.scale_mode;
    scratch.k_scale = cache.k_scale;
    scratch.v_scale = cache.v_scale;
    scratch.k_scales = scratch_ks.data();
    scratch.v_scales = scratch_vs.data();
  }
  cpu::insert_kv(scratch, InsertKVArgs{k_rows.data(), v_rows.data(), src, scratch_slots.data(), T}, w.cpu_options());
  std::vector<double> got_k, want_k, got_v, want_v;
  double k[D], v[D];
  for (std::int64_t i = 0; i < T; ++i) {
    const std::int64_t slot = a.slots[i];
    for (std::int32_t h = 0; h < H; ++h) {
      ref::read_kv_row(cache, slot / kBlockSize, h, slot % kBlockSize, k, v);
      got_k.insert(got_k.end(), k, k + D);
      got_v.insert(got_v.end(), v, v + D);
      ref::read_kv_row(scratch, i / kBlockSize, h, i % kBlockSize, k, v);
      want_k.insert(want_k.end(), k, k + D);
      want_v.insert(want_v.end(), v, v + D);
    }
  }
  r.outputs.push_back(compare_values("K", got_k, want_k));
  r.outputs.push_back(compare_values("V", got_v, want_v));

  // Index keys, through a scratch index cache of the workload's dtype likewise.
  const IndexCacheView index_cache = w.index_view();
  std::vector<std::uint8_t> scratch_index_bytes(std::size_t(pages * index_page_bytes(index_cache.dtype)));
  const IndexCacheView scratch_index =
      make_index_cache_view(index_cache.dtype, scratch_index_bytes.data(), pages, 0, index_cache.global_scale);
  cpu::insert_index(scratch_index, InsertIndexArgs{ik_rows.data(), src, scratch_slots.data(), T}, w.cpu_options());
  got.clear();
  want.clear();
  double row[D];
  for (std::int64_t i = 0; i < T; ++i) {
    const std::int64_t slot = a.index_slots[i];
    ref::read_index_row(index_cache, slot / kBlockSize, slot % kBlockSize, row);
    got.insert(got.end(), row, row + D);
    ref::read_index_row(scratch_index, i / kBlockSize, i % kBlockSize, row);
    want.insert(want.end(), row, row + D);
  }
  r.outputs.push_back(compare_values("index keys", got, want));
  for (const PreAttentionCheck::Output& o : r.outputs) {
    if (!(o.rel <= r.bound) && r.problem.empty())
      r.problem = detail::concat("pre-attention ", o.name, ": relative Frobenius error ", o.rel, " (", o.differ,
                                 " of ", o.values, " values differ from the float64 oracle's)");
  }
  return r;
}

}  // namespace msa::tool
