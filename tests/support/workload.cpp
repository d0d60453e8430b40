#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "cpu/parallel.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa {

namespace {

// ---- counter-based random numbers ------------------------------------------------
// Every value is a pure function of (seed, stream, index), so the workload does
// not depend on the thread count or on the order of generation.

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// What a stream of numbers is for; part of its key.
enum Tag : std::uint64_t { kK = 1, kV, kIndexK, kBlockWalk, kIndexQ, kQ, kPages, kIndexPages };

std::uint64_t stream_key(std::uint64_t seed, Tag tag, std::uint64_t request) {
  return mix(mix(mix(seed) ^ tag) ^ (request * 0xD6E8FEB86659FD93ull));
}

// Element `i` of the unit normal stream `key` (Box-Muller over pairs of elements).
float normal_at(std::uint64_t key, std::uint64_t i) {
  const std::uint64_t h = mix(key ^ mix(i >> 1));
  const double u1 = (double(h >> 32) + 1.0) * 0x1p-32;  // (0, 1]
  const double u2 = double(h & 0xFFFFFFFFull) * 0x1p-32;
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 6.283185307179586 * u2;
  return float((i & 1) ? r * std::sin(a) : r * std::cos(a));
}

// out[j] = element first + j of the stream, j < n.
void fill_normal(float* out, std::int64_t n, std::uint64_t key, std::uint64_t first) {
  for (std::int64_t j = 0; j < n; ++j) out[j] = normal_at(key, first + std::uint64_t(j));
}

// Uniform integer in [0, n) from element i of a stream.
std::uint64_t uniform_below(std::uint64_t key, std::uint64_t i, std::uint64_t n) {
  return mix(key ^ mix(i)) % n;
}

// ---- storage ----------------------------------------------------------------------

void store(DType t, void* base, std::int64_t i, float x) {
  switch (t) {
    case DType::bf16:
      static_cast<std::uint16_t*>(base)[i] = num::float_to_bf16(x);
      return;
    case DType::fp16:
      static_cast<std::uint16_t*>(base)[i] = num::float_to_fp16(x);
      return;
    case DType::fp8_e4m3:
      static_cast<std::uint8_t*>(base)[i] = num::float_to_e4m3(x);
      return;
    default:
      fail("workload: cannot store dtype ", dtype_name(t));
  }
}

// Fills `bytes` with the NaN of `t` (bf16/fp16 0x7FFF, fp8 0x7F, nvfp4 bytes
// 0x7F: NaN group scales), or zeros when `poison` is off.
void fill_poison(std::vector<std::uint8_t>& bytes, DType t, bool poison) {
  if (!poison) {
    std::fill(bytes.begin(), bytes.end(), std::uint8_t{0});
    return;
  }
  if (dtype_bytes(t) == 2) {
    for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
      bytes[i] = 0xFF;
      bytes[i + 1] = 0x7F;
    }
  } else {
    std::fill(bytes.begin(), bytes.end(), std::uint8_t{0x7F});
  }
}

// Random permutation of [0, n) (Fisher-Yates on the stream `key`).
std::vector<std::int32_t> permutation(std::int64_t n, std::uint64_t key) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[i] = std::int32_t(i);
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::swap(p[i], p[uniform_below(key, std::uint64_t(i), std::uint64_t(i + 1))]);
  }
  return p;
}

std::int32_t blocks_of(std::int64_t tokens) {
  return std::int32_t((tokens + kBlockSize - 1) / kBlockSize);
}

// Index keys: ik[p] = a * c[p / 128] + b * noise[p], with c a per-block random
// walk (correlation kBlockRho between neighbouring blocks), unit variance.
constexpr float kBlockRho = 0.8f;
constexpr float kBlockWeight = 0.8f, kTokenWeight = 0.6f;  // 0.64 + 0.36 = 1
// Index queries drift along the sequence: correlation kQueryRho between neighbours.
constexpr float kQueryRho = 0.99f;
// Scales of the fp8 and nvfp4 caches (unit-variance values).
constexpr float kFp8Scale = 1.0f / 64.0f;
constexpr float kNvfp4GlobalScale = 1.0f / 256.0f;
// Global scale of an nvfp4 index cache. The index keys have unit variance, so a
// 16-value group has an amax of about 1 to 5 and its e4m3 scale amax / 6 / s
// lands in about 40 .. 220: inside e4m3's normal range [2^-6, 448], where its
// relative precision is the same everywhere, with room up to an amax of 10.5
// (the usual recipe s = amax / (6 * 448) for an amax of 10.5, ten standard
// deviations) before the largest scale saturates.
constexpr float kIndexNvfp4GlobalScale = 1.0f / 256.0f;

// The per-block component c: [blocks, 128].
std::vector<float> block_walk(std::uint64_t key, std::int32_t blocks) {
  std::vector<float> c(std::size_t(blocks) * kHeadDim);
  const float keep = std::sqrt(1.0f - kBlockRho * kBlockRho);
  for (std::int32_t b = 0; b < blocks; ++b) {
    for (int d = 0; d < kHeadDim; ++d) {
      const float n = normal_at(key, std::uint64_t(b) * kHeadDim + d);
      const std::size_t i = std::size_t(b) * kHeadDim + d;
      c[i] = b == 0 ? n : kBlockRho * c[i - kHeadDim] + keep * n;
    }
  }
  return c;
}

// Everything the workload generates for the tokens of one request.
struct RequestStreams {
  std::uint64_t k, v, index_k;
  std::vector<float> walk;  // [blocks, 128]
};

// K, V [n, H, 128] and index keys [n, 128] of positions [p0, p0 + n), stored as `t`.
void generate_tokens(const RequestStreams& s, int num_kv_heads, std::int64_t p0, std::int64_t n,
                     DType t, void* k, void* v, void* index_k, int threads) {
  const std::int64_t row = std::int64_t(num_kv_heads) * kHeadDim;
  cpu::parallel_for(n, threads, 64, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> tmp(static_cast<std::size_t>(row));
    for (std::int64_t i = begin; i < end; ++i) {
      const std::uint64_t p = std::uint64_t(p0 + i);
      fill_normal(tmp.data(), row, s.k, p * row);
      for (std::int64_t j = 0; j < row; ++j) store(t, k, i * row + j, tmp[j]);
      fill_normal(tmp.data(), row, s.v, p * row);
      for (std::int64_t j = 0; j < row; ++j) store(t, v, i * row + j, tmp[j]);
      const float* c = s.walk.data() + (p / kBlockSize) * kHeadDim;
      for (int d = 0; d < kHeadDim; ++d) {
        const float x = kBlockWeight * c[d] + kTokenWeight * normal_at(s.index_k, p * kHeadDim + d);
        store(t, index_k, i * kHeadDim + d, x);
      }
    }
  });
}

RequestStreams streams_of(const WorkloadSpec& spec, std::int32_t r, std::int32_t seq_len) {
  RequestStreams s;
  s.k = stream_key(spec.seed, kK, std::uint64_t(r));
  s.v = stream_key(spec.seed, kV, std::uint64_t(r));
  s.index_k = stream_key(spec.seed, kIndexK, std::uint64_t(r));
  s.walk = block_walk(stream_key(spec.seed, kBlockWalk, std::uint64_t(r)), blocks_of(seq_len));
  return s;
}

void check_spec(const WorkloadSpec& s) {
  s.model.validate();
  const DType kv = s.kv_dtype;
  MSA_CHECK(kv == DType::bf16 || kv == DType::fp16 || is_fp8(kv) || kv == DType::nvfp4,
            "workload kv_dtype = ", dtype_name(kv), " is not a KV cache dtype");
  MSA_CHECK(!is_fp8(kv) || s.fp8_scales == ScaleMode::per_tensor ||
                s.fp8_scales == ScaleMode::per_token_head,
            "workload fp8_scales must be per_tensor or per_token_head for an fp8 cache");
  MSA_CHECK(is_half(s.q_dtype) || s.q_dtype == DType::fp8_e4m3,
            "workload q_dtype = ", dtype_name(s.q_dtype),
            " is not a query dtype (bf16, fp16, fp8_e4m3)");
  MSA_CHECK(s.index_dtype == DType::bf16 || s.index_dtype == DType::fp8_e4m3 ||
                s.index_dtype == DType::nvfp4,
            "workload index_dtype = ", dtype_name(s.index_dtype),
            " is not an index cache dtype (bf16, fp8_e4m3, nvfp4)");
  MSA_CHECK(!s.fp8_index_query || s.index_dtype == DType::fp8_e4m3,
            "workload fp8_index_query needs an fp8_e4m3 index cache, not ", dtype_name(s.index_dtype));
  for (std::size_t r = 0; r < s.requests.size(); ++r) {
    const RequestShape& q = s.requests[r];
    MSA_CHECK(q.query_len >= 0 && q.context_len >= 0, "workload requests[", r, "] = (query_len ",
              q.query_len, ", context_len ", q.context_len, ") has a negative length");
    MSA_CHECK(std::int64_t(q.query_len) + q.context_len <= std::numeric_limits<std::int32_t>::max(),
              "workload requests[", r, "] is longer than int32 holds");
  }
}

}  // namespace

WorkloadBytes workload_bytes(const WorkloadSpec& spec) {
  check_spec(spec);
  const ModelConfig& m = spec.model;
  const double H = m.num_kv_heads, QH = m.num_q_heads, D = kHeadDim, N = kBlockSize;
  double tokens = 0, used = 0, max_blocks = 0, walk = 0;
  for (const RequestShape& r : spec.requests) {
    const double blocks = blocks_of(std::int64_t(r.query_len) + r.context_len);
    tokens += r.query_len;
    used += blocks;
    max_blocks = std::max(max_blocks, blocks);
    walk = std::max(walk, blocks * D * sizeof(float));
  }
  const double requests = double(spec.requests.size());
  const double pages = used + (spec.spare_pages >= 0 ? double(spec.spare_pages) : std::floor(used / 8) + 1);
  const DType kv = spec.kv_dtype;
  const double src = 2;  // new K / V / index keys and index queries: bf16 or fp16
  WorkloadBytes b;
  // As allocate_caches: (pages - 1) strides and one page.
  const double page = kv == DType::nvfp4 ? 2 * H * nvfp4::kSlotBytes : H * N * 2 * D * double(dtype_bytes(kv));
  const double stride = spec.page_stride == 0 ? page
                        : kv == DType::nvfp4 ? double(spec.page_stride)
                                             : double(spec.page_stride) * double(dtype_bytes(kv));
  b.kv_cache = pages > 0 ? (pages - 1) * stride + page : 0;
  if (is_fp8(kv) && spec.fp8_scales == ScaleMode::per_token_head) b.kv_cache += 2 * pages * N * H * sizeof(float);
  b.index_cache = pages * double(index_page_bytes(spec.index_dtype));
  if (spec.bf16_index_twin) b.index_cache += pages * double(index_page_bytes(DType::bf16));
  // Block tables and metadata (as build_tables; build_metadata's per-request
  // arrays at most 7 per request).
  b.step = 2 * requests * (max_blocks + 3) * sizeof(std::int32_t) + (7 * requests + 3) * sizeof(std::int32_t) +
           2 * tokens * sizeof(std::int32_t);
  // The step's inputs and outputs (as make_step_inputs).
  const double q_bytes = double(dtype_bytes(spec.q_dtype));
  const double out_bytes = 2;  // bf16 or fp16
  b.step += tokens * (3 * H * D * src + D * src + 2 * sizeof(std::int64_t) + QH * D * q_bytes +
                      H * m.topk * sizeof(std::int32_t) + QH * D * out_bytes + QH * sizeof(float));
  if (spec.fp8_index_query) b.step += tokens * H * D;                              // index_q_e4m3
  if (spec.bf16_index_twin) b.step += tokens * H * m.topk * sizeof(std::int32_t);  // twin_topk
  // Setup: the page permutations, the context chunks of insert_context, the
  // query floats of make_step_inputs and a request's block walk.
  const double chunk = 4096 * (2 * H * D * src + D * src + 2 * sizeof(std::int64_t));
  b.scratch = std::max({2 * pages * sizeof(std::int32_t), chunk, tokens * QH * D * sizeof(float)}) + walk;
  return b;
}

Workload::Workload(WorkloadSpec spec, const WorkloadProgress& progress) : spec_(std::move(spec)) {
  check_spec(spec_);
  BatchSpec batch;
  for (const RequestShape& r : spec_.requests) {
    batch.query_lens.push_back(r.query_len);
    batch.seq_lens.push_back(r.query_len + r.context_len);
  }
  batch.decode_threshold = spec_.decode_threshold;
  meta_ = build_metadata(batch);
  build_tables();
  allocate_caches();
  insert_context(progress);
  make_step_inputs();
  poison_outputs();
}

DType Workload::src_dtype() const {
  return spec_.q_dtype == DType::fp16 ? DType::fp16 : DType::bf16;
}
DType Workload::out_dtype() const {
  return spec_.q_dtype == DType::fp16 ? DType::fp16 : DType::bf16;
}

void Workload::build_tables() {
  std::int64_t used = 0;
  for (std::int32_t r = 0; r < meta_.num_requests; ++r) {
    max_blocks = std::max(max_blocks, meta_.num_blocks(r));
    used += meta_.num_blocks(r);
  }
  const std::int64_t spare = spec_.spare_pages >= 0 ? spec_.spare_pages : used / 8 + 1;
  num_pages = index_num_pages = used + spare;
  MSA_CHECK(num_pages <= std::numeric_limits<std::int32_t>::max(), "workload needs ", num_pages,
            " pages, more than int32 block-table entries hold");
  table_stride = max_blocks + 3;  // rows padded, so row_stride != max_blocks is exercised
  const auto rows = std::size_t(meta_.num_requests) * std::size_t(table_stride);
  block_table.assign(rows, -1);
  index_block_table.assign(rows, -1);
  const auto pages = permutation(num_pages, stream_key(spec_.seed, kPages, 0));
  const auto index_pages = permutation(index_num_pages, stream_key(spec_.seed, kIndexPages, 0));
  std::int64_t next = 0;
  for (std::int32_t r = 0; r < meta_.num_requests; ++r) {
    for (std::int32_t b = 0; b < meta_.num_blocks(r); ++b, ++next) {
      block_table[r * table_stride + b] = pages[next];
      index_block_table[r * table_stride + b] = index_pages[next];
    }
  }
}

KVCacheView Workload::kv_view_at(void* base, float* k_scales_at, float* v_scales_at) const {
  const int H = model().num_kv_heads;
  if (spec_.kv_dtype == DType::nvfp4) {
    return make_nvfp4_cache_view(base, num_pages, H, k_scale, v_scale, spec_.page_stride);
  }
  KVCacheView c =
      make_cache_view(spec_.kv_dtype, base, num_pages, H, spec_.layout, spec_.page_stride);
  if (is_fp8(spec_.kv_dtype)) {
    c.scale_mode = spec_.fp8_scales;
    c.k_scale = k_scale;
    c.v_scale = v_scale;
    if (c.scale_mode == ScaleMode::per_token_head) {
      c.k_scales = k_scales_at;
      c.v_scales = v_scales_at;
    }
  }
  return c;
}

IndexCacheView Workload::index_view_at(void* base) const {
  return make_index_cache_view(spec_.index_dtype, base, index_num_pages, 0, index_scale);
}

IndexCacheView Workload::twin_index_view_at(void* base) const {
  return make_index_cache_view(DType::bf16, base, index_num_pages);
}

BlockTable Workload::table_at(const std::int32_t* data) const {
  return BlockTable{data, meta_.num_requests, max_blocks, table_stride};
}

void Workload::allocate_caches() {
  const int H = model().num_kv_heads;
  const DType kv = spec_.kv_dtype;
  std::int64_t bytes = 0;
  if (kv == DType::nvfp4) {
    k_scale = v_scale = kNvfp4GlobalScale;
    const std::int64_t page = 2 * H * nvfp4::kSlotBytes;
    const std::int64_t stride = spec_.page_stride ? spec_.page_stride : page;
    bytes = num_pages ? (num_pages - 1) * stride + page : 0;
  } else {
    if (is_fp8(kv)) k_scale = v_scale = kFp8Scale;
    // One page spans H * 128 * 256 elements from its start in every layout.
    const std::int64_t page = std::int64_t(H) * kBlockSize * 2 * kHeadDim;
    const std::int64_t stride = spec_.page_stride ? spec_.page_stride : page;
    bytes = (num_pages ? (num_pages - 1) * stride + page : 0) * std::int64_t(dtype_bytes(kv));
  }
  kv_bytes.resize(std::size_t(bytes));
  fill_poison(kv_bytes, kv, spec_.poison);
  if (is_fp8(kv) && spec_.fp8_scales == ScaleMode::per_token_head) {
    const float fill = spec_.poison ? std::numeric_limits<float>::quiet_NaN() : 1.0f;
    k_scales.assign(std::size_t(num_pages) * kBlockSize * H, fill);
    v_scales.assign(k_scales.size(), fill);
  }
  if (spec_.index_dtype == DType::nvfp4) index_scale = kIndexNvfp4GlobalScale;
  index_bytes.resize(std::size_t(index_num_pages * index_page_bytes(spec_.index_dtype)));
  fill_poison(index_bytes, spec_.index_dtype, spec_.poison);
  if (spec_.bf16_index_twin) {
    twin_index_bytes.resize(std::size_t(index_num_pages * index_page_bytes(DType::bf16)));
    fill_poison(twin_index_bytes, DType::bf16, spec_.poison);
  }
}

void Workload::insert_context(const WorkloadProgress& progress) {
  const int H = model().num_kv_heads;
  const DType t = src_dtype();
  const std::size_t eb = dtype_bytes(t);
  constexpr std::int64_t kChunk = 4096;
  std::int64_t total = 0, done = 0;
  for (std::int32_t r = 0; r < meta_.num_requests; ++r) total += meta_.context_lens[r];
  std::vector<std::uint8_t> k(kChunk * H * kHeadDim * eb), v(k.size()), ik(kChunk * kHeadDim * eb);
  std::vector<std::int64_t> chunk_slots(kChunk), chunk_index_slots(kChunk);
  const KVCacheView cache = kv_view();
  const IndexCacheView index_cache = index_view();
  const IndexCacheView twin_cache = twin_index_view();
  for (std::int32_t r = 0; r < meta_.num_requests; ++r) {
    const std::int32_t context = meta_.context_lens[r];
    if (context == 0) continue;
    const RequestStreams s = streams_of(spec_, r, meta_.seq_lens[r]);
    for (std::int64_t p0 = 0; p0 < context; p0 += kChunk) {
      const std::int64_t n = std::min<std::int64_t>(kChunk, context - p0);
      generate_tokens(s, H, p0, n, t, k.data(), v.data(), ik.data(), spec_.num_threads);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = p0 + i, b = p / kBlockSize, o = p % kBlockSize;
        chunk_slots[i] = std::int64_t(page(r, std::int32_t(b))) * kBlockSize + o;
        chunk_index_slots[i] = std::int64_t(index_page(r, std::int32_t(b))) * kBlockSize + o;
      }
      cpu::insert_kv(cache, InsertKVArgs{k.data(), v.data(), t, chunk_slots.data(), n},
                     cpu_options());
      const InsertIndexArgs index_args{ik.data(), t, chunk_index_slots.data(), n};
      cpu::insert_index(index_cache, index_args, cpu_options());
      if (spec_.bf16_index_twin) cpu::insert_index(twin_cache, index_args, cpu_options());
      done += n;
      if (progress) progress("cached context", done, total);
    }
  }
}

void Workload::make_step_inputs() {
  const ModelConfig& m = model();
  const std::int64_t T = meta_.num_tokens, H = m.num_kv_heads, QH = m.num_q_heads, D = kHeadDim;
  const DType t = src_dtype();
  const std::size_t eb = dtype_bytes(t);
  new_k.resize(std::size_t(T * H * D) * eb);
  new_v.resize(new_k.size());
  new_index_k.resize(std::size_t(T * D) * eb);
  index_q.resize(std::size_t(T * H * D) * eb);
  slots.resize(std::size_t(T));
  index_slots.resize(std::size_t(T));
  std::vector<float> qf(std::size_t(T * QH * D));
  const float drift = std::sqrt(1.0f - kQueryRho * kQueryRho);
  for (std::int32_t r = 0; r < meta_.num_requests; ++r) {
    const std::int32_t t0 = meta_.query_start[r], n = meta_.query_start[r + 1] - t0;
    if (n == 0) continue;
    const std::int32_t context = meta_.context_lens[r];
    const RequestStreams s = streams_of(spec_, r, meta_.seq_lens[r]);
    generate_tokens(s, int(H), context, n, t, new_k.data() + t0 * H * D * eb,
                    new_v.data() + t0 * H * D * eb, new_index_k.data() + t0 * D * eb,
                    spec_.num_threads);
    const std::uint64_t iq_key = stream_key(spec_.seed, kIndexQ, std::uint64_t(r));
    const std::uint64_t q_key = stream_key(spec_.seed, kQ, std::uint64_t(r));
    std::vector<float> u(std::size_t(H * D));
    for (std::int32_t i = 0; i < n; ++i) {
      const std::int64_t tok = t0 + i, p = context + i;
      slots[tok] =
          std::int64_t(page(r, std::int32_t(p / kBlockSize))) * kBlockSize + p % kBlockSize;
      index_slots[tok] =
          std::int64_t(index_page(r, std::int32_t(p / kBlockSize))) * kBlockSize + p % kBlockSize;
      for (std::int64_t j = 0; j < H * D; ++j) {
        const float x = normal_at(iq_key, std::uint64_t(i) * H * D + j);
        u[j] = i == 0 ? x : kQueryRho * u[j] + drift * x;
        store(t, index_q.data(), tok * H * D + j, u[j]);
      }
      fill_normal(qf.data() + tok * QH * D, QH * D, q_key, std::uint64_t(i) * QH * D);
    }
  }
  q.resize(qf.size() * dtype_bytes(spec_.q_dtype));
  if (spec_.q_dtype == DType::fp8_e4m3) {
    float amax = 0.0f;
    for (float x : qf) amax = std::max(amax, std::fabs(x));
    q_scale = amax > 0.0f ? amax / fp8_max(DType::fp8_e4m3) : 1.0f;
    for (std::size_t i = 0; i < qf.size(); ++i)
      store(spec_.q_dtype, q.data(), std::int64_t(i), qf[i] / q_scale);
  } else {
    for (std::size_t i = 0; i < qf.size(); ++i)
      store(spec_.q_dtype, q.data(), std::int64_t(i), qf[i]);
  }
  if (spec_.fp8_index_query) {
    index_q_e4m3.resize(std::size_t(T * H * D));
    cpu::cast_index_query_e4m3(index_q.data(), t, T * H * D, index_q_e4m3.data(), cpu_options());
  }
  topk.resize(std::size_t(T * H * m.topk));
  if (spec_.bf16_index_twin) twin_topk.resize(topk.size());
  out.resize(std::size_t(T * QH * D) * dtype_bytes(out_dtype()));
  lse.resize(std::size_t(T * QH));
}

void Workload::poison_outputs() {
  std::fill(topk.begin(), topk.end(), spec_.poison ? std::numeric_limits<std::int32_t>::min() : -1);
  std::fill(twin_topk.begin(), twin_topk.end(), spec_.poison ? std::numeric_limits<std::int32_t>::min() : -1);
  fill_poison(out, out_dtype(), spec_.poison);
  std::fill(lse.begin(), lse.end(), spec_.poison ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
}

InsertKVArgs Workload::insert_kv_args() const {
  return InsertKVArgs{new_k.data(), new_v.data(), src_dtype(), slots.data(), meta_.num_tokens};
}

InsertIndexArgs Workload::insert_index_args() const {
  return InsertIndexArgs{new_index_k.data(), src_dtype(), index_slots.data(), meta_.num_tokens};
}

IndexerArgs Workload::indexer_args() {
  IndexerArgs a;
  a.index_q = spec_.fp8_index_query ? index_q_e4m3.data() : index_q.data();
  a.iq_dtype = spec_.fp8_index_query ? DType::fp8_e4m3 : src_dtype();
  a.num_kv_heads = model().num_kv_heads;
  a.init_blocks = model().init_blocks;
  a.local_blocks = model().local_blocks;
  a.cache = index_view();
  a.block_table = index_table();
  a.out = topk_view();
  return a;
}

IndexerArgs Workload::twin_indexer_args() {
  MSA_CHECK(spec_.bf16_index_twin, "workload: twin_indexer_args() needs spec.bf16_index_twin");
  IndexerArgs a = indexer_args();
  a.index_q = index_q.data();
  a.iq_dtype = src_dtype();
  a.cache = twin_index_view();
  a.out = TopkView::token_major(twin_topk.data(), model().num_kv_heads, model().topk);
  return a;
}

AttentionArgs Workload::attention_args() {
  AttentionArgs a;
  a.q = q.data();
  a.q_dtype = spec_.q_dtype;
  a.q_scale = q_scale;
  a.out = out.data();
  a.out_dtype = out_dtype();
  a.lse = lse.data();
  a.num_q_heads = model().num_q_heads;
  a.softmax_scale = model().softmax_scale;
  a.topk = topk_view();
  a.cache = kv_view();
  a.block_table = table();
  return a;
}

}  // namespace msa
