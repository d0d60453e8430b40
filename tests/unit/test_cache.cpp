// Cache views (contract 4): the strides every builder produces, checked through
// offset() against addresses computed by hand from the layout definitions.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "msa/cache.hpp"
#include "msa/error.hpp"

namespace {

using msa::DType;
using msa::Layout;

constexpr std::int64_t N = 128, D = 128;  // tokens per page, head dim

using msa::test::expect_error;

// Element index (from the allocation's base) of K (is_v 0) or V (is_v 1)
// element (p, h, t, d), written out from each layout's definition.
std::int64_t hand_index(Layout layout, std::int64_t page_stride, std::int64_t H, std::int64_t p,
                        std::int64_t h, std::int64_t t, std::int64_t d, int is_v) {
  switch (layout) {
    case Layout::hnd:  // [page][head][token][256], K columns 0..127, V 128..255
      return p * page_stride + ((h * N) + t) * 2 * D + is_v * D + d;
    case Layout::nhd:  // [page][token][head][256]
      return p * page_stride + ((t * H) + h) * 2 * D + is_v * D + d;
    case Layout::split:  // [page][2][token][head][128]
      return p * page_stride + is_v * N * H * D + (t * H + h) * D + d;
  }
  return -1;
}

struct Case {
  DType dtype;
  Layout layout;
  int heads;
  std::int64_t extra;  // elements added to the compact page stride
};

TEST(Cache, LayoutsGiveHandComputedAddresses) {
  const std::int64_t P = 3;
  for (DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (Layout layout : {Layout::hnd, Layout::nhd, Layout::split}) {
      for (int H : {1, 3, 4}) {
        for (std::int64_t extra : {std::int64_t(0), std::int64_t(4096 + 64)}) {
          SCOPED_TRACE(testing::Message() << msa::dtype_name(dt) << " " << msa::layout_name(layout)
                                          << " H=" << H << " extra=" << extra);
          const std::int64_t compact = H * N * 2 * D;
          const std::int64_t ps = compact + extra;
          const std::int64_t eb = std::int64_t(msa::dtype_bytes(dt));
          std::vector<unsigned char> buf(std::size_t(P * ps * eb));
          unsigned char* base = buf.data();
          const auto c = msa::make_cache_view(dt, base, P, H, layout, extra ? ps : 0);
          EXPECT_EQ(c.dtype, dt);
          EXPECT_EQ(c.num_pages, P);
          EXPECT_EQ(c.num_kv_heads, H);
          EXPECT_EQ(c.page_stride, ps);
          EXPECT_EQ(c.scale_mode, msa::is_fp8(dt) ? msa::ScaleMode::per_tensor : msa::ScaleMode::none);
          EXPECT_EQ(msa::cache_extent(c), (P - 1) * ps + compact);
          // Every (page, head, token) at a few columns, K and V.
          for (std::int64_t p = 0; p < P; ++p)
            for (std::int64_t h = 0; h < H; ++h)
              for (std::int64_t t = 0; t < N; t += 1 + (t % 5))
                for (std::int64_t d : {0, 1, 77, 127})
                  for (int is_v = 0; is_v < 2; ++is_v) {
                    const auto* ptr = static_cast<const unsigned char*>(is_v ? c.v : c.k) +
                                      c.offset(p, h, t, d) * eb;
                    ASSERT_EQ(ptr - base, hand_index(layout, ps, H, p, h, t, d, is_v) * eb)
                        << "p=" << p << " h=" << h << " t=" << t << " d=" << d << " is_v=" << is_v;
                  }
        }
      }
    }
  }
}

TEST(Cache, LayoutsCoverEveryByteOnce) {
  // Compact pages: the K and V elements of all layouts tile the allocation.
  for (Layout layout : {Layout::hnd, Layout::nhd, Layout::split}) {
    SCOPED_TRACE(msa::layout_name(layout));
    const std::int64_t P = 2, H = 3;
    std::vector<int> hits(std::size_t(P * H * N * 2 * D), 0);
    auto c = msa::make_cache_view(DType::fp8_e4m3, hits.data(), P, int(H), layout);
    // Offsets are in elements of 1 byte here; count by element index.
    const std::int64_t v_shift = static_cast<const char*>(c.v) - static_cast<const char*>(c.k);
    for (std::int64_t p = 0; p < P; ++p)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < N; ++t)
          for (std::int64_t d = 0; d < D; ++d) {
            ++hits[std::size_t(c.offset(p, h, t, d))];
            ++hits[std::size_t(c.offset(p, h, t, d) + v_shift)];
          }
    for (std::size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
  }
}

TEST(Cache, ExtentOfViewOnNullBase) {
  // A view built on a null base sizes the allocation it describes.
  for (Layout layout : {Layout::hnd, Layout::nhd, Layout::split}) {
    const auto c = msa::make_cache_view(DType::bf16, nullptr, 5, 2, layout);
    EXPECT_EQ(msa::cache_extent(c), 5 * 2 * N * 2 * D) << msa::layout_name(layout);
  }
  EXPECT_EQ(msa::cache_extent(msa::make_cache_view(DType::bf16, nullptr, 0, 2, Layout::hnd)), 0);
}

TEST(Cache, ScaleIndexIsSlotMajor) {
  const auto c = msa::make_cache_view(DType::fp8_e4m3, nullptr, 4, 3, Layout::hnd);
  // [num_pages * 128, num_kv_heads], indexed by (slot, head).
  EXPECT_EQ(c.scale_index(0, 0, 0), 0);
  EXPECT_EQ(c.scale_index(0, 2, 0), 2);
  EXPECT_EQ(c.scale_index(0, 0, 1), 3);
  EXPECT_EQ(c.scale_index(2, 1, 5), (2 * 128 + 5) * 3 + 1);
}

TEST(Cache, Nvfp4HeadSlotPages) {
  const std::int64_t P = 3, H = 3, slot = 128 * 72;
  for (std::int64_t extra : {std::int64_t(0), std::int64_t(1000)}) {
    SCOPED_TRACE(testing::Message() << "extra " << extra);
    const std::int64_t compact = 2 * H * slot, ps = compact + extra;
    std::vector<unsigned char> buf(std::size_t(P * ps));
    const auto c = msa::make_nvfp4_cache_view(buf.data(), P, int(H), 0.5f, 2.0f, extra ? ps : 0);
    EXPECT_EQ(c.dtype, DType::nvfp4);
    EXPECT_EQ(c.k, buf.data());
    EXPECT_EQ(c.v, buf.data());
    EXPECT_EQ(c.page_stride, ps);
    EXPECT_EQ(c.scale_mode, msa::ScaleMode::per_tensor);
    EXPECT_EQ(c.k_scale, 0.5f);
    EXPECT_EQ(c.v_scale, 2.0f);
    EXPECT_EQ(msa::cache_extent(c), (P - 1) * ps + compact);
    for (std::int64_t p = 0; p < P; ++p)
      for (std::int64_t h = 0; h < H; ++h)
        for (int is_v = 0; is_v < 2; ++is_v)
          EXPECT_EQ(msa::nvfp4::slot_offset(c, p, h, is_v), p * ps + (2 * h + is_v) * slot);
  }
  EXPECT_EQ(msa::nvfp4::kSlotBytes, 9216);
  // Inside a slot: 128 x 64 data bytes, then 128 x 8 scale bytes.
  EXPECT_EQ(msa::nvfp4::data_offset(0, 0), 0);
  EXPECT_EQ(msa::nvfp4::data_offset(5, 63), 5 * 64 + 63);
  EXPECT_EQ(msa::nvfp4::scale_offset(0, 0), 128 * 64);
  EXPECT_EQ(msa::nvfp4::scale_offset(127, 7), 128 * 64 + 127 * 8 + 7);
}

TEST(Cache, PageBytesPerHead) {
  EXPECT_EQ(msa::page_bytes_per_head(DType::bf16), 65536);
  EXPECT_EQ(msa::page_bytes_per_head(DType::fp16), 65536);
  EXPECT_EQ(msa::page_bytes_per_head(DType::fp8_e4m3), 32768);
  EXPECT_EQ(msa::page_bytes_per_head(DType::fp8_e5m2), 32768);
  EXPECT_EQ(msa::page_bytes_per_head(DType::nvfp4), 18432);
  expect_error([] { msa::page_bytes_per_head(DType::f32); }, "f32");
  expect_error([] { msa::page_bytes_per_head(DType::i32); }, "i32");
}

TEST(Cache, IndexCacheOffsets) {
  msa::IndexCacheView c;
  c.num_pages = 4;
  EXPECT_EQ(c.page_stride, 128 * 128);
  EXPECT_EQ(c.offset(2, 5, 7), 2 * 128 * 128 + 5 * 128 + 7);
  c.page_stride = 3 * 128 * 128;  // layer-outer packing
  EXPECT_EQ(c.offset(2, 5, 7), 2 * 3 * 128 * 128 + 5 * 128 + 7);
}

TEST(Cache, BadArgumentsThrow) {
  expect_error([] { msa::make_cache_view(DType::nvfp4, nullptr, 1, 1, Layout::hnd); }, "nvfp4");
  expect_error([] { msa::make_cache_view(DType::f32, nullptr, 1, 1, Layout::hnd); }, "f32");
  expect_error([] { msa::make_cache_view(DType::bf16, nullptr, -1, 1, Layout::hnd); },
               "num_pages = -1");
  expect_error([] { msa::make_cache_view(DType::bf16, nullptr, 1, 0, Layout::hnd); },
               "num_kv_heads = 0");
  expect_error([] { msa::make_cache_view(DType::bf16, nullptr, 1, 2, Layout::nhd, 65535); },
               "page_stride = 65535");
  expect_error([] { msa::make_cache_view(DType::bf16, nullptr, 1, 2, static_cast<Layout>(9)); },
               "layout = 9");
  expect_error([] { msa::make_nvfp4_cache_view(nullptr, 1, 0, 1.0f, 1.0f); }, "num_kv_heads = 0");
  expect_error([] { msa::make_nvfp4_cache_view(nullptr, -2, 1, 1.0f, 1.0f); }, "num_pages = -2");
  expect_error([] { msa::make_nvfp4_cache_view(nullptr, 1, 2, 1.0f, 1.0f, 36863); },
               "page_stride = 36863");
  expect_error([] { msa::make_nvfp4_cache_view(nullptr, 1, 1, 0.0f, 1.0f); }, "k_global_scale = 0");
  expect_error([] { msa::make_nvfp4_cache_view(nullptr, 1, 1, 1.0f, NAN); }, "v_global_scale");
  expect_error([] { msa::make_nvfp4_cache_view(nullptr, 1, 1, INFINITY, 1.0f); }, "k_global_scale");
  expect_error([] { msa::parse_layout("hdn"); }, "layout = 'hdn'");
  expect_error([] { msa::parse_layout("xyz", "--kv-layout"); }, "--kv-layout = 'xyz'");
}

TEST(Cache, LayoutNames) {
  for (Layout l : {Layout::hnd, Layout::nhd, Layout::split})
    EXPECT_EQ(msa::parse_layout(msa::layout_name(l)), l);
  EXPECT_EQ(msa::parse_layout("HND"), Layout::hnd);
  EXPECT_EQ(msa::parse_layout("NHD"), Layout::nhd);
}

}  // namespace
