// The CPU engine's pre-attention, insert, index and attend (and key-major attention) on small
// steps whose views, tables, top-k lists and slots the input may break, with
// the checks on or off. Every buffer is allocated to exactly what its view
// declares (a KV cache: num_pages pages of page_stride), so AddressSanitizer
// sees any access a check let through. Bad input must end in msa::Error (checks
// on) or be skipped (checks off); it must never fault.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fuzz_input.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/k2q.hpp"
#include "msa/key_major.hpp"
#include "msa/pre_attention.hpp"

using namespace msa;

namespace {

constexpr std::int64_t kMaxBytes = std::int64_t(16) << 20;

// Bytes filled from the input's generator.
std::vector<std::uint8_t> random_bytes(std::size_t n, std::mt19937& rng) {
  std::vector<std::uint8_t> b(std::max<std::size_t>(n, 1));
  for (auto& x : b) x = std::uint8_t(rng() & 0x3F);  // small finite values in every dtype
  return b;
}

// A stride the input may break.
std::int64_t maybe_broken(FuzzedDataProvider& in, std::int64_t usual) {
  return in.ConsumeIntegralInRange(0, 11) == 11 ? fuzz::sometimes(in, usual, -512, 1 << 17) : usual;
}

// Thrown by build() for an input whose buffers would be too large to fuzz.
struct TooLarge {};

struct Problem {
  BatchMetadata meta;
  int H = 1, QH = 1, K = 4;
  DType src = DType::bf16, q_dtype = DType::bf16;
  std::int32_t max_blocks = 0;
  std::int64_t pages = 0;
  std::vector<std::uint8_t> kv, v_apart, index;  // caches, exactly as declared
  std::vector<float> k_scales, v_scales;
  std::vector<std::int32_t> table, index_table, topk;
  std::vector<std::int64_t> slots;
  std::vector<std::uint8_t> q, out, index_q, new_k, new_v, new_index_k;
  std::vector<float> lse;
  KVCacheView cache;
  IndexCacheView index_cache;
  BlockTable kv_table, ix_table;
  TopkView topk_view;
};

void build(FuzzedDataProvider& in, Problem& pb, std::mt19937& rng) {
  pb.meta = fuzz::small_step(in);
  const std::int64_t T = pb.meta.num_tokens, R = pb.meta.num_requests;
  pb.H = 1 + in.ConsumeIntegralInRange(0, 1);
  pb.QH = pb.H * in.PickValueInArray({1, 2, 4});
  pb.K = 1 + in.ConsumeIntegralInRange(0, 5);
  std::int64_t used = 0;
  for (std::int32_t r = 0; r < R; ++r) {
    pb.max_blocks = std::max(pb.max_blocks, pb.meta.num_blocks(r));
    used += pb.meta.num_blocks(r);
  }
  pb.pages = used + in.ConsumeIntegralInRange(0, 2);

  // KV cache: a layout, then perhaps a broken stride or a moved V.
  const DType kv = in.PickValueInArray({DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4});
  const std::int64_t eb = kv == DType::nvfp4 ? 1 : std::int64_t(dtype_bytes(kv));
  const std::int64_t compact = kv == DType::nvfp4 ? 2 * pb.H * nvfp4::kSlotBytes : pb.H * 128 * 256;
  const std::int64_t extra = 16 * in.ConsumeIntegralInRange(0, 3);
  KVCacheView& c = pb.cache;
  c = kv == DType::nvfp4 ? make_nvfp4_cache_view(nullptr, pb.pages, pb.H, 0.5f, 0.25f, compact + extra)
                         : make_cache_view(kv, nullptr, pb.pages, pb.H, in.PickValueInArray({Layout::hnd, Layout::nhd, Layout::split}),
                                           compact + extra);
  const std::int64_t v_shift = reinterpret_cast<std::intptr_t>(c.v);  // bytes from K, as the builder placed V
  c.token_stride = maybe_broken(in, c.token_stride);
  c.head_stride = maybe_broken(in, c.head_stride);
  c.page_stride = maybe_broken(in, c.page_stride);
  const bool v_apart = kv != DType::nvfp4 && in.ConsumeIntegralInRange(0, 7) == 7;
  const std::int64_t v_at = kv == DType::nvfp4 ? 0 : maybe_broken(in, v_shift);
  if (c.page_stride > kMaxBytes || v_at > kMaxBytes || v_at < -kMaxBytes) throw TooLarge{};
  // The memory the view declares: num_pages pages of page_stride from K and
  // from V (from the lower of the two when they share the allocation). A page
  // stride that is not positive declares nothing sensible: the checks must
  // refuse it, and the buffer then holds compact pages.
  const std::int64_t declared = pb.pages * (c.page_stride >= 1 ? c.page_stride : compact) * eb;
  if (declared > kMaxBytes) throw TooLarge{};
  const std::int64_t apart = v_apart ? 0 : (v_at < 0 ? -v_at : v_at);
  pb.kv = random_bytes(std::size_t(declared + apart), rng);
  const auto base = reinterpret_cast<std::uintptr_t>(pb.kv.data());
  c.k = reinterpret_cast<void*>(base + std::uintptr_t(v_at < 0 && !v_apart ? -v_at : 0));
  if (v_apart) {
    pb.v_apart = random_bytes(std::size_t(declared), rng);
    c.v = pb.v_apart.data();
  } else {
    c.v = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(c.k) + std::uintptr_t(v_at));
  }
  if (is_fp8(kv) && in.ConsumeBool()) {
    c.scale_mode = ScaleMode::per_token_head;
    pb.k_scales.assign(std::size_t(pb.pages) * 128 * pb.H, 0.125f);
    pb.v_scales.assign(pb.k_scales.size(), 0.5f);
    c.k_scales = pb.k_scales.data();
    c.v_scales = pb.v_scales.data();
  }

  // Index cache.
  IndexCacheView& ic = pb.index_cache;
  ic.dtype = in.ConsumeBool() ? DType::bf16 : DType::fp8_e4m3;
  ic.num_pages = pb.pages;
  ic.page_stride = maybe_broken(in, 128 * 128 + 128 * in.ConsumeIntegralInRange(0, 2));
  if (ic.page_stride > kMaxBytes) throw TooLarge{};
  const std::int64_t index_bytes =
      pb.pages * (ic.page_stride >= 1 ? ic.page_stride : 128 * 128) * std::int64_t(dtype_bytes(ic.dtype));
  if (index_bytes > kMaxBytes) throw TooLarge{};
  pb.index = random_bytes(std::size_t(index_bytes), rng);
  ic.base = pb.index.data();

  // Block tables over shuffled pages, then perhaps a page outside the pool.
  const std::int64_t row_stride = maybe_broken(in, pb.max_blocks + in.ConsumeIntegralInRange(0, 2));
  if (row_stride > (1 << 17)) throw TooLarge{};
  const std::int64_t entries = R == 0 ? 0 : (R - 1) * std::max<std::int64_t>(row_stride, 0) + pb.max_blocks;
  for (std::vector<std::int32_t>* t : {&pb.table, &pb.index_table}) {
    std::vector<std::int32_t> perm(std::size_t(pb.pages));
    for (std::int64_t i = 0; i < pb.pages; ++i) perm[i] = std::int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    t->assign(std::size_t(std::max<std::int64_t>(entries, 1)), -1);
    std::int64_t next = 0;
    for (std::int32_t r = 0; r < R && row_stride >= pb.max_blocks; ++r)
      for (std::int32_t b = 0; b < pb.meta.num_blocks(r); ++b) (*t)[r * row_stride + b] = perm[next++];
    for (int i = in.ConsumeIntegralInRange(0, 2); i > 0; --i)
      (*t)[in.ConsumeIntegralInRange<std::size_t>(0, t->size() - 1)] = std::int32_t(fuzz::sometimes(in, -1, -5, 1 << 20));
  }
  pb.kv_table = BlockTable{pb.table.data(), std::int32_t(R), pb.max_blocks, row_stride};
  pb.ix_table = BlockTable{pb.index_table.data(), std::int32_t(R), pb.max_blocks, row_stride};

  // The step's tensors, exactly sized.
  pb.src = in.ConsumeBool() ? DType::bf16 : DType::fp16;
  pb.new_k = random_bytes(std::size_t(T * pb.H * 128 * 2), rng);
  pb.new_v = random_bytes(pb.new_k.size(), rng);
  pb.new_index_k = random_bytes(std::size_t(T * 128 * 2), rng);
  pb.index_q = random_bytes(std::size_t(T * pb.H * 128 * 2), rng);
  pb.slots.assign(std::size_t(std::max<std::int64_t>(T, 1)), -1);
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int32_t p = pb.meta.token_position[t], r = pb.meta.token_request[t];
    if (p >= 0 && row_stride >= pb.max_blocks) pb.slots[t] = std::int64_t(pb.table[r * row_stride + p / 128]) * 128 + p % 128;
  }
  for (int i = in.ConsumeIntegralInRange(0, 2); i > 0 && T > 0; --i)
    pb.slots[in.ConsumeIntegralInRange<std::size_t>(0, std::size_t(T - 1))] = fuzz::sometimes(in, -1, -3, 1 << 20);
  pb.q_dtype = in.PickValueInArray({pb.src, DType::fp8_e4m3});
  pb.q = random_bytes(std::size_t(T * pb.QH * 128 * std::int64_t(dtype_bytes(pb.q_dtype))), rng);
  pb.out.assign(std::size_t(std::max<std::int64_t>(T * pb.QH * 128 * 2, 1)), 0);
  pb.lse.assign(std::size_t(std::max<std::int64_t>(T * pb.QH, 1)), 0.0f);
  // Top-k: token-major, or a token stride from the input; the buffer holds
  // what the view addresses (T x H x K entries when the stride is negative).
  TopkView& v = pb.topk_view;
  v = TopkView::token_major(nullptr, pb.H, pb.K);
  if (in.ConsumeIntegralInRange(0, 15) == 15) v.token_stride = in.ConsumeIntegralInRange<std::int64_t>(-64, 64);
  const std::int64_t topk_entries =
      T > 0 && v.token_stride >= 0 ? (T - 1) * v.token_stride + (pb.H - 1) * v.head_stride + pb.K : T * pb.H * pb.K;
  pb.topk.assign(std::size_t(std::max<std::int64_t>(topk_entries, 1)), -1);
  v.data = pb.topk.data();
}

// Pre-attention of the step from qkv rows of a row stride, positions and a
// cos/sin table the input may break; outputs into the problem's q and a
// fresh index query, K / V / index keys into the caches.
void pre_attention(FuzzedDataProvider& in, Problem& pb, const cpu::Options& opt, std::mt19937& rng) {
  const std::int64_t T = pb.meta.num_tokens;
  PreAttentionArgs a;
  a.num_tokens = T;
  a.num_q_heads = pb.QH;
  a.num_kv_heads = pb.H;
  a.num_index_heads = pb.H;
  a.qkv_dtype = pb.src;
  a.qkv_row_stride = in.ConsumeIntegralInRange(0, 7) == 7 ? in.ConsumeIntegralInRange<std::int64_t>(-200, 5000)
                                                          : in.ConsumeBool() ? 0 : a.row_width() + 64;
  const std::int64_t stride = a.row_stride() >= a.row_width() ? a.row_stride() : a.row_width();
  const std::vector<std::uint8_t> qkv = random_bytes(std::size_t(T > 0 ? ((T - 1) * stride + a.row_width()) * 2 : 0), rng);
  a.qkv = qkv.data();
  std::vector<std::int64_t> positions(std::size_t(std::max<std::int64_t>(T, 1)), 0);
  for (std::int64_t t = 0; t < T; ++t) positions[t] = std::max(pb.meta.token_position[t], 0);
  for (int i = in.ConsumeIntegralInRange(0, 2); i > 0 && T > 0; --i)
    positions[in.ConsumeIntegralInRange<std::size_t>(0, std::size_t(T - 1))] = fuzz::sometimes(in, -1, -3, 5000);
  a.positions = positions.data();
  const std::vector<float> weights(4 * kHeadDim, 0.5f);
  a.q_weight = weights.data();
  a.k_weight = weights.data() + kHeadDim;
  a.index_q_weight = weights.data() + 2 * kHeadDim;
  a.index_k_weight = weights.data() + 3 * kHeadDim;
  a.max_position = 1 + in.ConsumeIntegralInRange(0, 999);
  std::vector<float> cos_sin(std::size_t(a.max_position * kRopeDims));
  make_rope_table(kM3RopeTheta, a.max_position, cos_sin.data());
  a.cos_sin = cos_sin.data();
  a.q = pb.q.data();
  a.q_dtype = pb.q_dtype;
  a.q_scale = 0.02f;
  a.index_q_dtype = pb.index_cache.dtype == DType::fp8_e4m3 && in.ConsumeBool() ? DType::fp8_e4m3 : pb.src;
  std::vector<std::uint8_t> index_q(std::size_t(std::max<std::int64_t>(T * pb.H * kHeadDim * 2, 1)));
  a.index_q = index_q.data();
  a.slots = pb.slots.data();
  std::vector<std::int64_t> index_slots;
  if (in.ConsumeBool()) {
    index_slots = pb.slots;
    a.index_slots = index_slots.data();
  }
  try {
    cpu::pre_attention(pb.cache, pb.index_cache, a, opt);
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  std::mt19937 rng(in.ConsumeIntegral<std::uint32_t>());
  Problem pb;
  try {
    build(in, pb, rng);
  } catch (const Error&) {
    return 0;
  } catch (const TooLarge&) {
    return 0;
  }
  const StepView step = pb.meta.view();
  const std::int64_t T = pb.meta.num_tokens;
  const cpu::Options opt{1, in.ConsumeBool()};
  const DType src = pb.src;
  if (in.ConsumeBool()) pre_attention(in, pb, opt, rng);
  try {
    cpu::insert_kv(pb.cache, InsertKVArgs{pb.new_k.data(), pb.new_v.data(), src, pb.slots.data(), T}, opt);
  } catch (const Error&) {
  }
  try {
    cpu::insert_index(pb.index_cache, InsertIndexArgs{pb.new_index_k.data(), src, pb.slots.data(), T}, opt);
  } catch (const Error&) {
  }
  IndexerArgs ia;
  ia.index_q = pb.index_q.data();
  ia.iq_dtype = src;
  ia.num_kv_heads = pb.H;
  ia.init_blocks = in.ConsumeIntegralInRange(0, 1);
  ia.local_blocks = in.ConsumeIntegralInRange(0, 1);
  ia.cache = pb.index_cache;
  ia.block_table = pb.ix_table;
  ia.out = pb.topk_view;
  try {
    cpu::index(step, ia, opt);
  } catch (const Error&) {
  }
  const std::int32_t score_blocks = std::int32_t(fuzz::sometimes(in, pb.max_blocks, -1, 9));
  std::vector<float> scores(std::size_t(std::max<std::int64_t>(T * pb.H * std::max(score_blocks, 0), 1)));
  try {
    cpu::block_scores(step, ia, scores.data(), score_blocks, opt);
  } catch (const Error&) {
  }
  // Top-k entries the indexer would never write.
  for (int i = in.ConsumeIntegralInRange(0, 3); i > 0; --i)
    pb.topk[in.ConsumeIntegralInRange<std::size_t>(0, pb.topk.size() - 1)] = std::int32_t(fuzz::sometimes(in, 0, -3, 12));

  AttentionArgs a;
  a.q = pb.q.data();
  a.q_dtype = pb.q_dtype;
  a.q_scale = 0.01f;
  a.out = pb.out.data();
  a.out_dtype = a.q_dtype == DType::fp8_e4m3 ? DType::bf16 : src;
  a.lse = in.ConsumeBool() ? pb.lse.data() : nullptr;
  a.num_q_heads = pb.QH;
  a.topk = pb.topk_view;
  a.cache = pb.cache;
  a.block_table = pb.kv_table;
  try {
    cpu::attend(step, a, opt);
  } catch (const Error&) {
  }
  if (in.ConsumeBool()) {
    try {
      const K2QPlan plan = build_k2q(step, a.topk, pb.H);
      std::vector<float> partial(std::max<std::size_t>(cpu::key_major_partial_floats(std::int32_t(T), pb.QH, pb.K), 1));
      std::vector<float> partial_lse(std::max<std::size_t>(partial.size() / 128, 1));
      cpu::attend_key_major(step, a, plan, partial.data(), partial_lse.data(), opt);
    } catch (const Error&) {
    }
  }
  return 0;
}
