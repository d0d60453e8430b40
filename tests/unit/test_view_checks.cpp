// The view checks (src/core/check_cache_view.cpp, check_views.cpp): every
// layout the project defines is accepted, and every check rejects its bad
// view with a message naming the argument and the value. Views are checked by
// address only, so most views here point into small buffers or at made-up
// addresses that are never read.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "msa/cache.hpp"
#include "msa/error.hpp"

namespace {

using msa::DType;
using msa::KVCacheView;
using msa::Layout;
using msa::ScaleMode;
using msa::test::expect_error;
namespace check = msa::check;

constexpr std::int64_t N = 128, D = 128;

// A made-up, well-aligned address: views are checked, never read, here.
void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
constexpr std::uintptr_t kBase = std::uintptr_t(1) << 40;

KVCacheView packed(DType dt, Layout l, int heads, std::int64_t pages = 4, std::int64_t page_stride = 0) {
  KVCacheView c = msa::make_cache_view(dt, at(kBase), pages, heads, l, page_stride);
  return c;
}

// ---- KV cache --------------------------------------------------------------------

TEST(ViewChecks, EveryLayoutIsAccepted) {
  for (DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (Layout l : {Layout::hnd, Layout::nhd, Layout::split}) {
      for (int heads : {1, 2, 3, 8}) {
        for (std::int64_t extra : {std::int64_t(0), std::int64_t(4096)}) {
          SCOPED_TRACE(testing::Message() << msa::dtype_name(dt) << " " << msa::layout_name(l) << " H=" << heads
                                          << " extra=" << extra);
          const std::int64_t compact = heads * N * 2 * D;
          EXPECT_NO_THROW(check::cache_view(packed(dt, l, heads, 4, extra ? compact + extra : 0)));
        }
      }
    }
  }
  EXPECT_NO_THROW(check::cache_view(msa::make_nvfp4_cache_view(at(kBase), 5, 3, 1.0f, 2.0f)));
  EXPECT_NO_THROW(check::cache_view(msa::make_nvfp4_cache_view(at(kBase), 5, 3, 1.0f, 2.0f, 6 * 9216 + 16)));
}

TEST(ViewChecks, SeparateKAndVAndOtherStrides) {
  // K only in one allocation ([page][head][token][128]), V in another, after or before it.
  KVCacheView c;
  c.dtype = DType::bf16;
  c.num_pages = 10;
  c.num_kv_heads = 2;
  c.token_stride = D;
  c.head_stride = N * D;
  c.page_stride = 2 * N * D;
  c.k = at(kBase);
  c.v = at(kBase + 10 * 2 * N * D * 2);  // right after K
  EXPECT_NO_THROW(check::cache_view(c));
  c.v = at(kBase - 10 * 2 * N * D * 2);  // right before K
  EXPECT_NO_THROW(check::cache_view(c));
  c.v = at(kBase + 10 * 2 * N * D * 2 - 2);  // the last element of K is V's first
  expect_error([&] { check::cache_view(c); },
               {"cache.page_stride = 32768 is smaller than the", "elements one page of K and V spans"});
  // Heads in the gaps of the tokens (neither stride nests the other): checked row by row.
  c.v = at(kBase + (std::uintptr_t(1) << 30));
  c.token_stride = 3 * D;
  c.head_stride = 4 * D;
  c.page_stride = 127 * 3 * D + 4 * D + D;
  EXPECT_NO_THROW(check::cache_view(c));
  c.head_stride = 3 * D;  // head 1 on the rows of token 1
  expect_error([&] { check::cache_view(c); },
               "cache.token_stride = 384 and cache.head_stride = 384 make rows overlap: K[h=0, t=1] at element "
               "384 and K[h=1, t=0] at element 384 of a page");
  // One head: its stride is never used, whatever it holds.
  c.num_kv_heads = 1;
  c.head_stride = -5;
  EXPECT_NO_THROW(check::cache_view(c));
  // No pages: nothing is read, null bases are fine.
  KVCacheView empty = msa::make_cache_view(DType::bf16, nullptr, 0, 1, Layout::nhd);
  empty.k = empty.v = nullptr;
  EXPECT_NO_THROW(check::cache_view(empty));
}

TEST(ViewChecks, CacheStridesOfTheWrongSignOrSize) {
  const auto bad = [](auto edit, const std::vector<std::string>& words) {
    KVCacheView c = packed(DType::bf16, Layout::hnd, 2);
    edit(c);
    expect_error([&] { check::cache_view(c); }, words);
  };
  bad([](KVCacheView& c) { c.page_stride = -1; }, {"cache.page_stride = -1"});
  bad([](KVCacheView& c) { c.page_stride = 100; }, {"cache.page_stride = 100"});
  bad([](KVCacheView& c) { c.page_stride = 0; }, {"cache.page_stride = 0"});
  bad([](KVCacheView& c) { c.token_stride = -128; }, {"cache.token_stride = -128 must be >= 128"});
  bad([](KVCacheView& c) { c.token_stride = 64; }, {"cache.token_stride = 64 must be >= 128"});
  bad([](KVCacheView& c) { c.token_stride = 0; }, {"cache.token_stride = 0"});
  bad([](KVCacheView& c) { c.head_stride = -32768; }, {"cache.head_stride = -32768 must be >= 128"});
  bad([](KVCacheView& c) { c.head_stride = 127; }, {"cache.head_stride = 127"});
  // The HND page one element short.
  bad([](KVCacheView& c) { c.page_stride = 2 * N * 2 * D - 1; },
      {"cache.page_stride = 65535 is smaller than the 65536 elements one page of K and V spans"});
  // Huge strides: sizes beyond 2^62 are refused before any arithmetic can overflow.
  bad([](KVCacheView& c) { c.token_stride = std::int64_t(1) << 61; }, {"cache.token_stride"});
  bad([](KVCacheView& c) { c.page_stride = std::int64_t(1) << 62; }, {"page_stride"});
  bad([](KVCacheView& c) { c.num_pages = std::int64_t(1) << 50; }, {"num_pages"});
}

TEST(ViewChecks, KAndVRelation) {
  const auto bad = [](Layout l, std::int64_t v_elements, const std::vector<std::string>& words) {
    KVCacheView c = packed(DType::bf16, l, 2);
    c.v = at(kBase + std::uintptr_t(v_elements * 2));
    expect_error([&] { check::cache_view(c); }, words);
  };
  bad(Layout::hnd, 0, {"cache.v starts 0 elements after cache.k, so K and V rows overlap"});
  bad(Layout::hnd, 64, {"cache.v starts 64 elements after cache.k"});
  bad(Layout::nhd, 200, {"cache.v starts 200 elements after cache.k"});
  bad(Layout::split, 128, {"cache.v starts 128 elements after cache.k"});
  // V before K inside the same pages: the same test, mirrored.
  bad(Layout::hnd, -64, {"cache.v starts -64 elements after cache.k"});
  // The split page's V half moved so that it runs into the next page.
  bad(Layout::split, N * 2 * D + D, {"cache.page_stride = 65536 is smaller than", "one page of K and V spans"});
  // An odd byte between K and V of a bf16 cache.
  KVCacheView c = packed(DType::bf16, Layout::hnd, 1);
  c.v = at(kBase + 2 * D + 1);
  expect_error([&] { check::cache_view(c); }, {"cache.v = ", "not 2-byte aligned"});
  // V mirrored before K by exactly the gap: the NHD rows of the previous token.
  KVCacheView m = packed(DType::fp8_e4m3, Layout::nhd, 2);
  m.v = at(kBase - D);
  EXPECT_NO_THROW(check::cache_view(m));
}

TEST(ViewChecks, CacheAlignmentAndScales) {
  KVCacheView c = packed(DType::fp16, Layout::hnd, 1);
  c.k = at(kBase + 1);
  c.v = at(kBase + 1 + 2 * D);
  expect_error([&] { check::cache_view(c); }, {"cache.k = ", "is not 2-byte aligned (fp16)"});
  // fp8 is byte-addressed: any base.
  KVCacheView f = packed(DType::fp8_e5m2, Layout::hnd, 1);
  f.k = at(kBase + 1);
  f.v = at(kBase + 1 + D);
  EXPECT_NO_THROW(check::cache_view(f));
  // Per-token scales: aligned floats, apart from each other and from the pages.
  KVCacheView s = packed(DType::fp8_e4m3, Layout::hnd, 2, 3);
  s.scale_mode = ScaleMode::per_token_head;
  const std::uintptr_t scales = kBase + (std::uintptr_t(1) << 32);
  s.k_scales = static_cast<float*>(at(scales));
  s.v_scales = static_cast<float*>(at(scales + 3 * N * 2 * 4));
  EXPECT_NO_THROW(check::cache_view(s));
  KVCacheView t = s;
  t.v_scales = static_cast<float*>(at(scales + 3 * N * 2 * 4 - 4));
  expect_error([&] { check::cache_view(t); }, {"cache.k_scales", "overlaps cache.v_scales"});
  t = s;
  t.k_scales = static_cast<float*>(at(kBase + 1000));
  expect_error([&] { check::cache_view(t); }, {"cache.k_scales", "overlaps cache.k"});
  t = s;
  t.k_scales = static_cast<float*>(at(scales + 2));
  expect_error([&] { check::cache_view(t); }, {"cache.k_scales = ", "not 4-byte aligned"});
  // Scales that do not go with the dtype.
  t = s;
  t.scale_mode = static_cast<ScaleMode>(7);
  expect_error([&] { check::cache_view(t); }, {"cache.scale_mode = unknown"});
  t = s;
  t.dtype = static_cast<DType>(200);
  expect_error([&] { check::cache_view(t); }, {"cache.dtype = unknown is not a KV cache dtype"});
}

TEST(ViewChecks, Nvfp4Pages) {
  KVCacheView c = msa::make_nvfp4_cache_view(at(kBase), 4, 2, 1.0f, 1.0f);
  KVCacheView b = c;
  b.page_stride = 2 * 2 * 9216 - 1;
  expect_error([&] { check::cache_view(b); }, {"cache.page_stride = 36863 bytes is smaller than one nvfp4 page"});
  b = c;
  b.page_stride = -36864;
  expect_error([&] { check::cache_view(b); }, {"cache.page_stride = -36864"});
  b = c;
  b.v = at(kBase + 9216);
  expect_error([&] { check::cache_view(b); }, {"cache.v differs from cache.k"});
  b = c;
  b.num_pages = std::int64_t(1) << 60;
  expect_error([&] { check::cache_view(b); }, {"cache.k", "outside [0, 2^62]"});
  // The address space ends before the pages do.
  b = c;
  b.k = b.v = at(~std::uintptr_t(0) - 4096);
  expect_error([&] { check::cache_view(b); }, {"wraps around the address space"});
}

TEST(ViewChecks, RowByRowCheckIsBounded) {
  KVCacheView c;
  c.dtype = DType::fp8_e4m3;
  c.scale_mode = ScaleMode::per_tensor;
  c.num_pages = 1;
  c.num_kv_heads = 600;
  c.token_stride = 3 * D;
  c.head_stride = 4 * D;  // does not nest: would need 600 x 128 rows sorted
  c.page_stride = std::int64_t(1) << 30;
  c.k = at(kBase);
  c.v = at(kBase + (std::uintptr_t(1) << 36));
  expect_error([&] { check::cache_view(c); }, {"do not nest", "num_kv_heads = 600"});
  c.head_stride = 128 * 3 * D;  // nests: any number of heads
  EXPECT_NO_THROW(check::cache_view(c));
}

// ---- index cache -----------------------------------------------------------------

TEST(ViewChecks, IndexCache) {
  msa::IndexCacheView c{DType::bf16, at(kBase), 8, N * D};
  EXPECT_NO_THROW(check::index_cache_view(c));
  const auto bad = [&](auto edit, const std::vector<std::string>& words) {
    msa::IndexCacheView b = c;
    edit(b);
    expect_error([&] { check::index_cache_view(b); }, words);
  };
  bad([](msa::IndexCacheView& b) { b.page_stride = -N * D; }, {"index_cache.page_stride = -16384"});
  bad([](msa::IndexCacheView& b) { b.page_stride = N * D - 1; }, {"index_cache.page_stride = 16383"});
  bad([](msa::IndexCacheView& b) { b.base = at(kBase + 1); }, {"index_cache.base", "not 2-byte aligned"});
  bad([](msa::IndexCacheView& b) { b.num_pages = std::int64_t(1) << 50; }, {"index_cache", "outside [0, 2^62]"});
  bad([](msa::IndexCacheView& b) { b.dtype = DType::i32; }, {"index_cache.dtype = i32"});
  msa::IndexCacheView f{DType::fp8_e4m3, at(kBase + 1), 8, N * D};
  EXPECT_NO_THROW(check::index_cache_view(f));  // bytes: any base
}

// ---- block table -----------------------------------------------------------------

TEST(ViewChecks, BlockTable) {
  const auto* data = static_cast<const std::int32_t*>(at(kBase));
  EXPECT_NO_THROW(check::block_table_view({data, 4, 10, 12}, 4, 100, "block_table"));
  EXPECT_NO_THROW(check::block_table_view({data, 1, 10, -3}, 1, 100, "block_table"));  // one row: no stride
  EXPECT_NO_THROW(check::block_table_view({nullptr, 4, 10, 12}, 4, 0, "block_table"));  // no pages to read
  EXPECT_NO_THROW(check::block_table_view({nullptr, 4, 0, 0}, 4, 100, "block_table"));  // no columns
  expect_error([&] { check::block_table_view({data, 3, 10, 12}, 4, 100, "block_table"); },
               "block_table.num_rows = 3 but the step has 4 requests");
  expect_error([&] { check::block_table_view({data, 4, -1, 12}, 4, 100, "my_table"); },
               "my_table.max_blocks = -1 is negative");
  expect_error([&] { check::block_table_view({data, 4, 10, -12}, 4, 100, "block_table"); },
               "block_table.row_stride = -12 is below max_blocks = 10 (rows would overlap)");
  expect_error([&] { check::block_table_view({data, 4, 10, 9}, 4, 100, "block_table"); },
               "block_table.row_stride = 9");
  expect_error([&] { check::block_table_view({nullptr, 4, 10, 12}, 4, 100, "block_table"); },
               "block_table.data is null but the table has 4 requests x 10 columns over a cache of 100 pages");
  expect_error([&] { check::block_table_view({data + 0, 4, 10, std::int64_t(1) << 61}, 4, 100, "block_table"); },
               {"block_table", "outside [0, 2^62]"});
  const auto* odd = static_cast<const std::int32_t*>(at(kBase + 2));
  expect_error([&] { check::block_table_view({odd, 4, 10, 12}, 4, 100, "block_table"); },
               {"block_table = ", "not 4-byte aligned"});
}

// ---- top-k -------------------------------------------------------------------------

TEST(ViewChecks, Topk) {
  auto* data = static_cast<std::int32_t*>(at(kBase));
  EXPECT_NO_THROW(check::topk_view(msa::TopkView::token_major(data, 3, 16), 100, 3, "topk"));
  EXPECT_NO_THROW(check::topk_view({data, 16, 16, 100 * 16}, 100, 3, "topk"));  // head-major
  EXPECT_NO_THROW(check::topk_view({data, 16, 20, 100 * 20}, 100, 3, "topk"));  // padded rows
  EXPECT_NO_THROW(check::topk_view({data, 16, -16, 16}, 1, 1, "topk"));         // one row: strides unused
  EXPECT_NO_THROW(check::topk_view({nullptr, 16, 16, 16}, 0, 1, "topk"));       // no tokens
  const auto bad = [&](msa::TopkView v, const std::vector<std::string>& words) {
    expect_error([&] { check::topk_view(v, 100, 3, "topk"); }, words);
  };
  bad({data, 0, 48, 16}, {"topk.topk = 0 is outside [1, 64]"});
  bad({data, 65, 48 * 5, 65}, {"topk.topk = 65"});
  bad({nullptr, 16, 48, 16}, {"topk.data is null but the step has 100 tokens"});
  bad({data, 16, -48, 16}, {"topk.token_stride = -48 is negative"});
  bad({data, 16, 48, -16}, {"topk.head_stride = -16 is negative"});
  bad({data, 16, 47, 16}, {"topk rows overlap: token_stride = 47, head_stride = 16"});
  bad({data, 16, 48, 15}, {"topk rows overlap", "head_stride = 15"});
  bad({data, 16, 0, 16}, {"topk rows overlap", "token_stride = 0"});
  bad({data, 16, std::int64_t(1) << 61, 16}, {"topk", "outside [0, 2^62]"});
  bad({static_cast<std::int32_t*>(at(kBase + 1)), 16, 48, 16}, {"topk = ", "not 4-byte aligned"});
}

// ---- dense arrays, overlap ------------------------------------------------------------

TEST(ViewChecks, DenseArrays) {
  EXPECT_NO_THROW(check::dense_view(at(kBase), DType::bf16, 1000, "q"));
  EXPECT_NO_THROW(check::dense_view(nullptr, DType::f32, 1000, "lse", true));
  EXPECT_NO_THROW(check::dense_view(at(kBase + 1), DType::fp8_e4m3, 1000, "q"));
  expect_error([] { check::dense_view(nullptr, DType::bf16, 5, "q"); }, "q is null but holds 5 elements");
  expect_error([] { check::dense_view(at(kBase + 1), DType::bf16, 5, "q"); }, {"q = ", "not 2-byte aligned (bf16)"});
  expect_error([] { check::dense_view(at(kBase + 2), DType::f32, 5, "lse", true); }, {"lse = ", "not 4-byte aligned"});
  expect_error([] { check::dense_view(at(kBase), DType::bf16, std::int64_t(1) << 62, "out"); },
               {"out", "outside [0, 2^62]"});
  expect_error([] { check::dense_view(at(kBase), DType::bf16, -1, "out"); }, "out has -1 elements");
}

TEST(ViewChecks, Overlap) {
  const check::Span a{"out", kBase, 100};
  EXPECT_NO_THROW(check::no_overlap(a, {"q", kBase + 100, 50}));
  EXPECT_NO_THROW(check::no_overlap(a, {"q", kBase - 50, 50}));
  EXPECT_NO_THROW(check::no_overlap(a, {"q", kBase, 0}));
  expect_error([&] { check::no_overlap(a, {"q", kBase + 99, 50}); }, {"out (100 bytes at ", ") overlaps q (50 bytes"});
  expect_error([&] { check::no_overlap(a, {"cache.k", kBase - 1000, 1001}); }, {"overlaps cache.k"});
}

TEST(ViewChecks, StepPointersAreAligned) {
  msa::StepView s;
  const std::int32_t zero[1] = {0};
  s.query_start = zero;
  EXPECT_NO_THROW(check::step_shape(s));
  s.query_start = static_cast<const std::int32_t*>(at(kBase + 1));
  expect_error([&] { check::step_shape(s); }, {"step.query_start = ", "not 4-byte aligned"});
}

}  // namespace
