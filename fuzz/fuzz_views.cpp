// The view checks on views of any fields: whatever they accept must be safe,
// verified here row by row. An accepted KV cache view has its K and V rows
// (nvfp4: head slots) pairwise disjoint and inside the spans it declares; an
// accepted top-k view or block table has disjoint rows inside its span. The
// views point at made-up addresses: the checks read none.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/checks.hpp"
#include "fuzz_input.hpp"
#include "msa/cache.hpp"
#include "verify.hpp"

using namespace msa;
using msa::fuzz::expect_disjoint;

namespace {

constexpr std::uintptr_t kBase = std::uintptr_t(1) << 44;

void expect_inside(std::uintptr_t begin, std::uintptr_t end, const check::Span& s) {
  FUZZ_ASSERT(begin >= s.begin && end <= s.begin + s.bytes);
}

std::int64_t stride(FuzzedDataProvider& in, std::int64_t usual) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 5: return in.ConsumeIntegralInRange<std::int64_t>(-300, 70000);
    case 6: return usual + 128 * in.ConsumeIntegralInRange<std::int64_t>(-3, 3);
    case 7: return fuzz::sometimes(in, usual, -(1 << 20), 1 << 20);
    default: return usual;
  }
}

void kv_cache(FuzzedDataProvider& in) {
  const DType dtype = in.PickValueInArray({DType::bf16, DType::fp8_e4m3, DType::fp16, DType::fp8_e5m2, DType::nvfp4,
                                          DType::f32, static_cast<DType>(in.ConsumeIntegral<std::uint8_t>())});
  const std::int64_t pages = in.ConsumeIntegralInRange(0, 3);
  // Now and then 600 heads: past the row-by-row bound of the checks.
  const int heads = in.ConsumeIntegralInRange(0, 63) == 63
                        ? 600
                        : int(fuzz::sometimes(in, 1 + in.ConsumeIntegralInRange(0, 3), -1, 9));
  const Layout layout = in.PickValueInArray({Layout::hnd, Layout::nhd, Layout::split});
  KVCacheView c;
  try {
    c = dtype == DType::nvfp4 ? make_nvfp4_cache_view(reinterpret_cast<void*>(kBase), pages, heads, 1.0f, 1.0f)
                              : make_cache_view(dtype, reinterpret_cast<void*>(kBase), pages, heads, layout);
  } catch (const Error&) {
    c.dtype = dtype;
    c.k = c.v = reinterpret_cast<void*>(kBase);
    c.num_pages = pages;
    c.num_kv_heads = heads;
  }
  c.token_stride = stride(in, c.token_stride);
  c.head_stride = stride(in, c.head_stride);
  c.page_stride = stride(in, c.page_stride);
  if (in.ConsumeBool()) {  // V moved, in K's memory or far away
    const std::int64_t shift = in.ConsumeBool() ? in.ConsumeIntegralInRange<std::int64_t>(-70000, 140000)
                                                : std::int64_t(1) << 36;
    c.v = reinterpret_cast<void*>(kBase + std::uintptr_t(shift));
  }
  c.scale_mode = in.PickValueInArray({c.scale_mode, ScaleMode::per_token_head, ScaleMode::none});
  if (c.scale_mode == ScaleMode::per_token_head) {
    c.k_scales = reinterpret_cast<float*>(kBase + (std::uintptr_t(1) << 40));
    c.v_scales = reinterpret_cast<float*>(kBase + (std::uintptr_t(1) << 40) + (in.ConsumeBool() ? 1 << 20 : 64));
  }
  try {
    check::cache_view(c);
  } catch (const Error&) {
    return;
  }
  const check::CacheSpans s = check::cache_spans(c);
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> rows;
  const auto k = reinterpret_cast<std::uintptr_t>(c.k), v = reinterpret_cast<std::uintptr_t>(c.v);
  for (std::int64_t p = 0; p < c.num_pages; ++p) {
    for (std::int64_t h = 0; h < c.num_kv_heads; ++h) {
      if (c.dtype == DType::nvfp4) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          const std::uintptr_t at = k + std::uintptr_t(nvfp4::slot_offset(c, p, h, is_v));
          rows.push_back({at, at + nvfp4::kSlotBytes});
          expect_inside(at, at + nvfp4::kSlotBytes, s.k);
        }
        continue;
      }
      const auto eb = std::uintptr_t(dtype_bytes(c.dtype));
      for (std::int64_t t = 0; t < kBlockSize; ++t) {
        const std::uintptr_t off = std::uintptr_t(c.offset(p, h, t, 0)) * eb, len = kHeadDim * eb;
        rows.push_back({k + off, k + off + len});
        rows.push_back({v + off, v + off + len});
        expect_inside(k + off, k + off + len, s.k);
        expect_inside(v + off, v + off + len, s.v);
      }
    }
  }
  if (s.k_scales.bytes > 0) {
    rows.push_back({s.k_scales.begin, s.k_scales.begin + s.k_scales.bytes});
    rows.push_back({s.v_scales.begin, s.v_scales.begin + s.v_scales.bytes});
  }
  expect_disjoint(rows);
}

void topk(FuzzedDataProvider& in) {
  const std::int64_t tokens = in.ConsumeIntegralInRange(0, 6), heads = in.ConsumeIntegralInRange(0, 3);
  const auto k = std::int32_t(fuzz::sometimes(in, 1 + in.ConsumeIntegralInRange(0, 15), -2, 70));
  TopkView v = TopkView::token_major(reinterpret_cast<std::int32_t*>(kBase), int(heads), k);
  v.token_stride = stride(in, v.token_stride);
  v.head_stride = stride(in, v.head_stride);
  check::Span s;
  try {
    s = check::topk_view(v, tokens, heads, "topk");
  } catch (const Error&) {
    return;
  }
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> rows;
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::uintptr_t at = kBase + 4 * std::uintptr_t(t * v.token_stride + h * v.head_stride);
      rows.push_back({at, at + 4 * std::uintptr_t(v.topk)});
      expect_inside(at, at + 4 * std::uintptr_t(v.topk), s);
    }
  expect_disjoint(rows);
}

void block_table(FuzzedDataProvider& in) {
  BlockTable t{reinterpret_cast<const std::int32_t*>(kBase), in.ConsumeIntegralInRange(0, 5),
               in.ConsumeIntegralInRange(-1, 9), 0};
  t.row_stride = stride(in, t.max_blocks);
  const std::int64_t requests = in.ConsumeIntegralInRange(0, 5);
  check::Span s;
  try {
    s = check::block_table_view(t, requests, 1 + in.ConsumeIntegralInRange(0, 100), "block_table");
  } catch (const Error&) {
    return;
  }
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> rows;
  for (std::int64_t r = 0; r < t.num_rows && t.max_blocks > 0; ++r) {
    const std::uintptr_t at = kBase + 4 * std::uintptr_t(r * t.row_stride);
    rows.push_back({at, at + 4 * std::uintptr_t(t.max_blocks)});
    expect_inside(at, at + 4 * std::uintptr_t(t.max_blocks), s);
  }
  expect_disjoint(rows);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0: kv_cache(in); break;
    case 1: topk(in); break;
    default: block_table(in); break;
  }
  return 0;
}
