// cpu::insert_kv and cpu::insert_index (contract 2-4): placement in every
// layout, fp8 scales, nvfp4 bytes against a quantizer written here, skipped and
// bad slots, and every input check of src/core/check_insert.cpp.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace {

using msa::DType;
using msa::Layout;
using std::int64_t;
using std::uint16_t;
using std::uint8_t;

constexpr int N = 128, D = 128;

using msa::test::expect_error;

// K and V of T tokens, H heads, in bf16 or fp16 bits, with a few special rows:
// token 0 head 0 K is all zero, token 1 head 0 V holds one large value.
struct Source {
  DType dtype;
  int T, H;
  std::vector<uint16_t> k, v;  // [T, H, 128]
  float k_at(int64_t i) const { return decode(k[std::size_t(i)]); }
  float v_at(int64_t i) const { return decode(v[std::size_t(i)]); }
  float decode(uint16_t b) const {
    return dtype == DType::bf16 ? msa::num::bf16_to_float(b) : msa::num::fp16_to_float(b);
  }
};

Source make_source(DType dtype, int T, int H, std::uint64_t seed, float amplitude = 1.0f) {
  Source s{dtype, T, H, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, amplitude);
  auto enc = [&](float x) {
    return dtype == DType::bf16 ? msa::num::float_to_bf16(x) : msa::num::float_to_fp16(x);
  };
  for (int64_t i = 0; i < int64_t(T) * H * D; ++i) {
    s.k.push_back(enc(normal(rng)));
    s.v.push_back(enc(normal(rng)));
  }
  if (T > 1) {
    std::fill(s.k.begin(), s.k.begin() + D, enc(0.0f));
    s.v[std::size_t(H * D + 5)] = enc(1000.0f * amplitude);
  }
  return s;
}

// T distinct slots in [0, P*128), shuffled, every 7th replaced by a negative value.
std::vector<int64_t> make_slots(int T, int64_t P, std::uint64_t seed) {
  std::vector<int64_t> all(std::size_t(P * N));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  std::vector<int64_t> slots(all.begin(), all.begin() + T);
  for (int i = 3; i < T; i += 7) slots[std::size_t(i)] = i % 2 ? -1 : -int64_t(i) * 1000;
  return slots;
}

msa::InsertKVArgs kv_args(const Source& s, const std::vector<int64_t>& slots) {
  return msa::InsertKVArgs{s.k.data(), s.v.data(), s.dtype, slots.data(), s.T};
}

// The stored code the cache should hold for value x (scale divides first for fp8).
uint16_t expected_code(DType dt, float x, float scale) {
  switch (dt) {
    case DType::bf16: return msa::num::float_to_bf16(x);
    case DType::fp16: return msa::num::float_to_fp16(x);
    case DType::fp8_e4m3: return msa::num::float_to_e4m3(x / scale);
    case DType::fp8_e5m2: return msa::num::float_to_e5m2(x / scale);
    default: return 0;
  }
}

uint16_t read_code(const msa::KVCacheView& c, int is_v, int64_t p, int64_t h, int64_t t, int64_t d) {
  const auto* base = static_cast<const uint8_t*>(is_v ? c.v : c.k);
  const int64_t off = c.offset(p, h, t, d);
  if (msa::dtype_bytes(c.dtype) == 1) return base[off];
  uint16_t b;
  std::memcpy(&b, base + off * 2, 2);
  return b;
}

// Marks the bytes of every K/V row the insert wrote; all other bytes must still
// hold the poison.
void expect_rest_poisoned(const msa::KVCacheView& c, const std::vector<uint8_t>& buf,
                          const std::vector<int64_t>& slots, uint8_t poison) {
  std::vector<char> written(buf.size(), 0);
  const int64_t eb = int64_t(msa::dtype_bytes(c.dtype));
  for (int64_t slot : slots) {
    if (slot < 0) continue;
    for (int64_t h = 0; h < c.num_kv_heads; ++h)
      for (int is_v = 0; is_v < 2; ++is_v) {
        const auto* row = static_cast<const uint8_t*>(is_v ? c.v : c.k) +
                          c.offset(slot / N, h, slot % N, 0) * eb;
        std::fill_n(written.begin() + (row - buf.data()), D * eb, 1);
      }
  }
  for (std::size_t i = 0; i < buf.size(); ++i)
    if (!written[i]) {
      ASSERT_EQ(buf[i], poison) << "byte " << i << " was not written by any token";
    }
}

// ---- placement: every layout, packed dtypes, per-tensor scales --------------------

TEST(InsertKV, SameValuesInEveryLayout) {
  const int H = 3, T = 131;
  const int64_t P = 5;
  const std::uint64_t seed = 1234;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<int64_t> slots = make_slots(T, P, seed);
  for (DType src : {DType::bf16, DType::fp16}) {
    const Source s = make_source(src, T, H, seed + 1);
    for (DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
      std::vector<uint16_t> first;  // logical read-back of the first layout
      for (Layout layout : {Layout::hnd, Layout::nhd, Layout::split}) {
        for (int64_t extra : {int64_t(0), int64_t(3 * 128 + 16)}) {
          SCOPED_TRACE(testing::Message() << "src " << msa::dtype_name(src) << " cache "
                                          << msa::dtype_name(dt) << " " << msa::layout_name(layout)
                                          << " extra " << extra);
          const int64_t eb = int64_t(msa::dtype_bytes(dt));
          const int64_t ps = int64_t(H) * N * 2 * D + extra;
          std::vector<uint8_t> buf(std::size_t(P * ps * eb), 0xFF);  // NaN in every dtype
          auto c = msa::make_cache_view(dt, buf.data(), P, H, layout, ps);
          c.k_scale = 0.37f;
          c.v_scale = 1.9f;
          msa::cpu::insert_kv(c, kv_args(s, slots), {.num_threads = 3});
          std::vector<uint16_t> logical;
          for (int64_t i = 0; i < T; ++i) {
            const int64_t slot = slots[std::size_t(i)];
            if (slot < 0) continue;
            for (int64_t h = 0; h < H; ++h)
              for (int64_t d = 0; d < D; ++d) {
                const int64_t si = (i * H + h) * D + d;
                const uint16_t kc = read_code(c, 0, slot / N, h, slot % N, d);
                const uint16_t vc = read_code(c, 1, slot / N, h, slot % N, d);
                ASSERT_EQ(kc, expected_code(dt, s.k_at(si), c.k_scale)) << "K token " << i << " h " << h << " d " << d;
                ASSERT_EQ(vc, expected_code(dt, s.v_at(si), c.v_scale)) << "V token " << i << " h " << h << " d " << d;
                logical.push_back(kc);
                logical.push_back(vc);
              }
          }
          if (first.empty()) first = logical;
          EXPECT_EQ(logical, first);
          expect_rest_poisoned(c, buf, slots, 0xFF);
        }
      }
    }
  }
}

TEST(InsertKV, AnyLayoutThroughStrides) {
  // [page][head][K|V][token][128]: neither HND, NHD nor split, described by strides alone.
  const int H = 3, T = 50;
  const int64_t P = 2;
  const std::vector<int64_t> slots = make_slots(T, P, 17);
  const Source s = make_source(DType::fp16, T, H, 18);
  std::vector<uint16_t> buf(std::size_t(P) * H * 2 * N * D, 0xFFFF);
  msa::KVCacheView c;
  c.dtype = DType::bf16;
  c.k = buf.data();
  c.v = buf.data() + N * D;
  c.num_pages = P;
  c.num_kv_heads = H;
  c.page_stride = int64_t(H) * 2 * N * D;
  c.head_stride = 2 * N * D;
  c.token_stride = D;
  msa::cpu::insert_kv(c, kv_args(s, slots));
  for (int64_t i = 0; i < T; ++i) {
    const int64_t slot = slots[std::size_t(i)];
    if (slot < 0) continue;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; d += 9) {
        const int64_t si = (i * H + h) * D + d;
        const int64_t k_at = (slot / N) * H * 2 * N * D + h * 2 * N * D + (slot % N) * D + d;
        ASSERT_EQ(buf[std::size_t(k_at)], msa::num::float_to_bf16(s.k_at(si)));
        ASSERT_EQ(buf[std::size_t(k_at + N * D)], msa::num::float_to_bf16(s.v_at(si)));
      }
  }
  std::vector<uint8_t> bytes(buf.size() * 2);
  std::memcpy(bytes.data(), buf.data(), bytes.size());
  c.k = bytes.data();
  c.v = bytes.data() + N * D * 2;
  expect_rest_poisoned(c, bytes, slots, 0xFF);
}

TEST(InsertKV, Fp16CacheOverflowsToInf) {
  // A bf16 source beyond fp16's range becomes +-inf in an fp16 cache.
  Source s{DType::bf16, 1, 1, std::vector<uint16_t>(D, 0x3F80), std::vector<uint16_t>(D, 0x3F80)};
  s.k[3] = msa::num::float_to_bf16(1e6f);
  s.v[4] = msa::num::float_to_bf16(-1e6f);
  std::vector<uint16_t> buf(std::size_t(N) * 2 * D, 0);
  const auto c = msa::make_cache_view(DType::fp16, buf.data(), 1, 1, Layout::hnd);
  const std::vector<int64_t> slots = {5};
  msa::cpu::insert_kv(c, kv_args(s, slots));
  EXPECT_EQ(buf[5 * 256 + 3], 0x7C00);
  EXPECT_EQ(buf[5 * 256 + 128 + 4], 0xFC00);
  EXPECT_EQ(buf[5 * 256 + 0], 0x3C00);
}

// ---- fp8 per-(token, head) scales --------------------------------------------------

TEST(InsertKV, Fp8PerTokenHeadScales) {
  const int H = 2, T = 70;
  const int64_t P = 3;
  const std::uint64_t seed = 99;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<int64_t> slots = make_slots(T, P, seed);
  const Source s = make_source(DType::bf16, T, H, seed + 1, 3.0f);
  for (DType dt : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    SCOPED_TRACE(msa::dtype_name(dt));
    const float fmax = dt == DType::fp8_e4m3 ? 448.0f : 57344.0f;
    std::vector<uint8_t> buf(std::size_t(P) * H * N * 2 * D, 0x55);
    std::vector<float> ks(std::size_t(P) * N * H, NAN), vs(ks.size(), NAN);
    auto c = msa::make_cache_view(dt, buf.data(), P, H, Layout::nhd);
    c.scale_mode = msa::ScaleMode::per_token_head;
    c.k_scales = ks.data();
    c.v_scales = vs.data();
    msa::cpu::insert_kv(c, kv_args(s, slots));
    std::vector<char> scale_written(ks.size(), 0);
    for (int64_t i = 0; i < T; ++i) {
      const int64_t slot = slots[std::size_t(i)];
      if (slot < 0) continue;
      for (int64_t h = 0; h < H; ++h) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          float amax = 0.0f;
          for (int64_t d = 0; d < D; ++d) {
            const int64_t si = (i * H + h) * D + d;
            amax = std::max(amax, std::fabs(is_v ? s.v_at(si) : s.k_at(si)));
          }
          const float want_scale = amax == 0.0f ? 1.0f : amax / fmax;
          const std::size_t idx = std::size_t((slot * H) + h);  // [num_pages * 128, H]
          const float scale = (is_v ? vs : ks)[idx];
          ASSERT_EQ(scale, want_scale) << "token " << i << " head " << h << " is_v " << is_v;
          scale_written[idx] = 1;
          const uint16_t max_code = dt == DType::fp8_e4m3 ? 0x7E : 0x7B;
          bool hit_max = false;
          for (int64_t d = 0; d < D; ++d) {
            const int64_t si = (i * H + h) * D + d;
            const float x = is_v ? s.v_at(si) : s.k_at(si);
            const uint16_t code = read_code(c, is_v, slot / N, h, slot % N, d);
            ASSERT_EQ(code, expected_code(dt, x, want_scale)) << "token " << i << " d " << d;
            const float back = (dt == DType::fp8_e4m3 ? msa::num::e4m3_to_float(uint8_t(code))
                                                      : msa::num::e5m2_to_float(uint8_t(code))) * scale;
            ASSERT_LE(std::fabs(back - x), 0.13f * std::fabs(x) + 3e-6f * amax);
            hit_max |= (code & 0x7F) == max_code;
          }
          if (amax > 0.0f) {
            EXPECT_TRUE(hit_max) << "the largest element should map to fp8 max";
          }
        }
      }
    }
    EXPECT_EQ(ks[std::size_t(slots[0] * H)], 1.0f);  // token 0 head 0 K is all zero
    for (std::size_t j = 0; j < ks.size(); ++j)
      if (!scale_written[j]) {
        ASSERT_TRUE(std::isnan(ks[j]) && std::isnan(vs[j])) << "scale " << j;
      }
    expect_rest_poisoned(c, buf, slots, 0x55);
  }
}

// ---- nvfp4 --------------------------------------------------------------------------

// An e4m3 / e2m1 quantizer written from the format definitions: the nearest
// code by search, ties to the even code, saturating.
double e4m3_value(int code) {  // code in [0, 126]
  const int e = code >> 3, m = code & 7;
  return e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
}
int nearest_code(double a, int num_codes, double (*value)(int)) {
  int best = 0;
  for (int c = 1; c < num_codes; ++c) {
    const double db = std::fabs(a - value(best)), dc = std::fabs(a - value(c));
    if (dc < db || (dc == db && c % 2 == 0)) best = c;
  }
  return best;
}
double e2m1_value(int code) {
  static const double v[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return v[code];
}

// Expected 72 bytes (64 data, 8 scales) of one token row of a head slot.
void nvfp4_reference(const float* x, float s, uint8_t* data, uint8_t* scales) {
  for (int g = 0; g < D / 16; ++g) {
    float amax = 0.0f;
    for (int j = 0; j < 16; ++j)
      if (!std::isnan(x[g * 16 + j])) amax = std::max(amax, std::fabs(x[g * 16 + j]));
    const float t = std::max(amax / 6.0f / s, std::ldexp(1.0f, -9));
    const int sf = t >= 448.0f ? 126 : nearest_code(t, 127, e4m3_value);
    scales[g] = uint8_t(sf);
    const float sfv = float(e4m3_value(sf));
    for (int j = 0; j < 16; ++j) {
      const float q = x[g * 16 + j] / s / sfv;
      int code = 0;
      if (!std::isnan(q)) {
        code = std::fabs(q) >= 6.0f ? 7 : nearest_code(std::fabs(q), 8, e2m1_value);
        if (code != 0 && q < 0) code |= 8;  // no negative zero
      }
      const int e = g * 16 + j;
      if (e % 2 == 0) data[e / 2] = uint8_t(code);
      else data[e / 2] = uint8_t(data[e / 2] | (code << 4));
    }
  }
}

TEST(InsertKV, Nvfp4BytesMatchIndependentQuantizer) {
  const int H = 2, T = 45;
  const int64_t P = 3, slot_bytes = 128 * 72, extra = 777;
  const std::uint64_t seed = 4242;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<int64_t> slots = make_slots(T, P, seed);
  for (DType src : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(msa::dtype_name(src));
    Source s = make_source(src, T, H, seed + 1, 0.8f);
    // Specials in token 2, head 1, K: a NaN, tiny negatives, a huge group.
    const auto enc = [&](float x) {
      return src == DType::bf16 ? msa::num::float_to_bf16(x) : msa::num::float_to_fp16(x);
    };
    const std::size_t r = std::size_t((2 * H + 1) * D);
    s.k[r + 1] = enc(NAN);
    for (int j = 16; j < 32; ++j) s.k[r + j] = enc(-1e-4f * float(j));
    for (int j = 32; j < 48; ++j) s.k[r + j] = enc(30000.0f);
    const float gk = 0.05f, gv = 3.0f;
    const int64_t ps = 2 * H * slot_bytes + extra;
    std::vector<uint8_t> buf(std::size_t(P * ps), 0xA5);
    const auto c = msa::make_nvfp4_cache_view(buf.data(), P, H, gk, gv, ps);
    msa::cpu::insert_kv(c, kv_args(s, slots), {.num_threads = 2});
    std::vector<uint8_t> want = std::vector<uint8_t>(buf.size(), 0xA5);
    for (int64_t i = 0; i < T; ++i) {
      const int64_t slot = slots[std::size_t(i)];
      if (slot < 0) continue;
      const int64_t page = slot / N, t = slot % N;
      for (int64_t h = 0; h < H; ++h)
        for (int is_v = 0; is_v < 2; ++is_v) {
          float x[D];
          for (int d = 0; d < D; ++d) {
            const int64_t si = (i * H + h) * D + d;
            x[d] = is_v ? s.v_at(si) : s.k_at(si);
          }
          // Slot 2h (K) or 2h+1 (V); 128 x 64 data bytes, then 128 x 8 scale bytes.
          uint8_t* slot_base = want.data() + page * ps + (2 * h + is_v) * slot_bytes;
          nvfp4_reference(x, is_v ? gv : gk, slot_base + t * 64, slot_base + 128 * 64 + t * 8);
        }
    }
    for (std::size_t b = 0; b < buf.size(); ++b)
      ASSERT_EQ(int(buf[b]), int(want[b])) << "byte " << b << " (page " << int64_t(b) / ps
                                           << ", offset " << int64_t(b) % ps << ")";
  }
}

// ---- slots ----------------------------------------------------------------------

TEST(InsertKV, NegativeSlotsSkipped) {
  const Source s = make_source(DType::bf16, 4, 1, 7);
  std::vector<uint8_t> buf(std::size_t(2) * N * 2 * D * 2, 0x33);
  const auto c = msa::make_cache_view(DType::bf16, buf.data(), 2, 1, Layout::hnd);
  const std::vector<int64_t> slots = {-1, -128, std::numeric_limits<int64_t>::min(), -7};
  msa::cpu::insert_kv(c, kv_args(s, slots));
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint8_t b) { return b == 0x33; }));
}

TEST(InsertKV, SlotBeyondCacheThrowsAndLeavesCacheUntouched) {
  const int H = 2, T = 40;
  const int64_t P = 5;
  std::vector<int64_t> slots = make_slots(T, P, 5);
  slots[17] = P * N;  // one past the last slot
  const Source s = make_source(DType::fp16, T, H, 6);
  // Room for P bf16 pages, then one guard page.
  std::vector<uint8_t> buf(std::size_t(P + 1) * H * N * 2 * D * 2);
  std::mt19937 rng(8);
  for (auto& b : buf) b = uint8_t(rng());
  std::vector<float> ks(std::size_t(P) * N * H, 0.25f), vs = ks;
  for (DType dt : {DType::fp8_e4m3, DType::bf16}) {
    const std::vector<uint8_t> before = buf;
    auto c = msa::make_cache_view(dt, buf.data(), P, H, Layout::hnd);
    if (msa::is_fp8(dt)) {
      c.scale_mode = msa::ScaleMode::per_token_head;
      c.k_scales = ks.data();
      c.v_scales = vs.data();
    }
    expect_error([&] { msa::cpu::insert_kv(c, kv_args(s, slots)); },
                 "slots[17] = 640 but the cache has 5 pages (640 slots)");
    EXPECT_TRUE(buf == before) << msa::dtype_name(dt) << " cache changed by a failed call";
    EXPECT_TRUE(std::all_of(ks.begin(), ks.end(), [](float x) { return x == 0.25f; }));
    EXPECT_TRUE(std::all_of(vs.begin(), vs.end(), [](float x) { return x == 0.25f; }));
  }
  // Without checks the bad slot is skipped, never written out of bounds.
  const std::vector<uint8_t> before = buf;
  const auto c = msa::make_cache_view(DType::bf16, buf.data(), P, H, Layout::hnd);
  msa::cpu::insert_kv(c, kv_args(s, slots), {.check = false});
  const std::size_t guard = std::size_t(P) * H * N * 2 * D * 2;  // the guard page
  EXPECT_TRUE(std::equal(buf.begin() + guard, buf.end(), before.begin() + guard));
  EXPECT_EQ(read_code(c, 0, slots[0] / N, 1, slots[0] % N, 9),
            msa::num::float_to_bf16(s.k_at(1 * D + 9)));
}

TEST(InsertKV, ThreadCountDoesNotChangeBytes) {
  const int H = 4, T = 300;
  const int64_t P = 4;
  const std::vector<int64_t> slots = make_slots(T, P, 31);
  const Source s = make_source(DType::bf16, T, H, 32);
  std::vector<uint8_t> one(std::size_t(P) * 2 * H * 128 * 72), many(one.size());
  msa::cpu::insert_kv(msa::make_nvfp4_cache_view(one.data(), P, H, 0.1f, 0.2f), kv_args(s, slots),
                      {.num_threads = 1});
  msa::cpu::insert_kv(msa::make_nvfp4_cache_view(many.data(), P, H, 0.1f, 0.2f), kv_args(s, slots),
                      {.num_threads = 5});
  EXPECT_TRUE(one == many);
}

// ---- index cache --------------------------------------------------------------------

TEST(InsertIndex, Bf16AndFp8SaturatingCast) {
  const int T = 77;
  const int64_t P = 3, ps = 128 * 128 + 200;
  const std::vector<int64_t> slots = make_slots(T, P, 61);
  for (DType src : {DType::bf16, DType::fp16}) {
    Source s = make_source(src, T, 1, 62, 60.0f);
    // Two values beyond e4m3's 448 (token 0 is never skipped).
    s.k[7] = src == DType::bf16 ? msa::num::float_to_bf16(5000.0f) : msa::num::float_to_fp16(5000.0f);
    s.k[9] = src == DType::bf16 ? msa::num::float_to_bf16(-6e4f) : msa::num::float_to_fp16(-6e4f);
    for (DType dt : {DType::bf16, DType::fp8_e4m3}) {
      SCOPED_TRACE(testing::Message() << msa::dtype_name(src) << " -> " << msa::dtype_name(dt));
      const int64_t eb = int64_t(msa::dtype_bytes(dt));
      std::vector<uint8_t> buf(std::size_t(P * ps * eb), 0xEE);
      msa::IndexCacheView c{dt, buf.data(), P, ps};
      msa::cpu::insert_index(c, msa::InsertIndexArgs{s.k.data(), src, slots.data(), T});
      std::vector<char> written(buf.size(), 0);
      int saturated = 0;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t slot = slots[std::size_t(i)];
        if (slot < 0) continue;
        const int64_t row = (slot / N) * ps + (slot % N) * D;  // [page][token][128]
        std::fill_n(written.begin() + row * eb, D * eb, 1);
        for (int64_t d = 0; d < D; ++d) {
          const float x = s.k_at(i * D + d);
          if (dt == DType::bf16) {
            uint16_t got;
            std::memcpy(&got, buf.data() + (row + d) * 2, 2);
            ASSERT_EQ(got, msa::num::float_to_bf16(x)) << "token " << i << " d " << d;
          } else {
            const uint8_t got = buf[std::size_t(row + d)];
            ASSERT_EQ(got, msa::num::float_to_e4m3(x)) << "token " << i << " d " << d;
            if (std::fabs(x) > 448.0f) {
              ASSERT_EQ(got & 0x7F, 0x7E);
              ++saturated;
            }
          }
        }
      }
      if (dt == DType::fp8_e4m3) {
        EXPECT_EQ(saturated, 2);
      }
      for (std::size_t b = 0; b < buf.size(); ++b)
        if (!written[b]) {
          ASSERT_EQ(buf[b], 0xEE) << "byte " << b;
        }
    }
  }
}

// nvfp4 index rows (contract 4.2): [page][token][72 bytes], 64 data bytes then
// 8 group scales, quantized like the nvfp4 KV cache; the bytes against the
// quantizer above, the dequantized values within half a code step.
TEST(InsertIndex, Nvfp4RowsMatchIndependentQuantizer) {
  const int T = 90;
  const int64_t P = 3, row_bytes = 72, page_bytes = 128 * row_bytes, extra = 333;
  const std::uint64_t seed = 4343;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  const std::vector<int64_t> slots = make_slots(T, P, seed);
  for (DType src : {DType::bf16, DType::fp16}) {
    for (float global : {1.0f / 256.0f, 0.0173f}) {
      SCOPED_TRACE(testing::Message() << msa::dtype_name(src) << " global scale " << global);
      Source s = make_source(src, T, 1, seed + 1, 1.3f);
      const auto enc = [&](float x) {
        return src == DType::bf16 ? msa::num::float_to_bf16(x) : msa::num::float_to_fp16(x);
      };
      // Token 2: a NaN, a group of tiny negatives (scale floor), a group whose
      // scale saturates, a zero group. Token 0 is all zero (make_source).
      const std::size_t r = std::size_t(2 * D);
      s.k[r + 1] = enc(NAN);
      for (int j = 16; j < 32; ++j) s.k[r + j] = enc(-1e-4f * float(j));
      for (int j = 32; j < 48; ++j) s.k[r + j] = enc(30000.0f * (j % 2 ? -1.0f : 1.0f));
      for (int j = 48; j < 64; ++j) s.k[r + j] = enc(0.0f);
      const int64_t ps = page_bytes + extra;
      std::vector<uint8_t> buf(std::size_t(P * ps), 0xA5), many(buf);
      const msa::IndexCacheView c = msa::make_index_cache_view(DType::nvfp4, buf.data(), P, ps, global);
      msa::cpu::insert_index(c, msa::InsertIndexArgs{s.k.data(), src, slots.data(), T}, {.num_threads = 1});
      msa::IndexCacheView cm = c;
      cm.base = many.data();
      msa::cpu::insert_index(cm, msa::InsertIndexArgs{s.k.data(), src, slots.data(), T}, {.num_threads = 2});
      ASSERT_TRUE(buf == many) << "the thread count changed the bytes";

      std::vector<uint8_t> want(buf.size(), 0xA5);
      int compared = 0;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t slot = slots[std::size_t(i)];
        if (slot < 0) continue;
        float x[D];
        for (int d = 0; d < D; ++d) x[d] = s.k_at(i * D + d);
        uint8_t* row = want.data() + (slot / N) * ps + (slot % N) * row_bytes;
        nvfp4_reference(x, global, row, row + 64);
        // Dequantized: e2m1(code) * scale * global within half the largest
        // code step (1 unit of scale * global) of the source value, or, where
        // the group's amax exceeds 6 units (a saturated or rounded-down
        // scale), within the clipped amount.
        for (int d = 0; d < D; ++d) {
          if (std::isnan(x[d])) continue;
          const uint8_t code = uint8_t(d % 2 ? row[d / 2] >> 4 : row[d / 2] & 0xF);
          const double unit = msa::num::e4m3_to_float(row[64 + d / 16]) * double(global);
          const double deq = double(msa::num::e2m1_to_float(code)) * unit;
          double amax = 0.0;
          for (int e = d / 16 * 16; e < d / 16 * 16 + 16; ++e)
            if (!std::isnan(x[e])) amax = std::max(amax, double(std::fabs(x[e])));
          ASSERT_LE(std::fabs(deq - double(x[d])), std::max(unit, amax - 6.0 * unit) * (1.0 + 1e-6))
              << "token " << i << " d " << d << " x " << x[d] << " deq " << deq;
          ++compared;
        }
      }
      EXPECT_GT(compared, 5000);
      for (std::size_t b = 0; b < buf.size(); ++b)
        ASSERT_EQ(int(buf[b]), int(want[b])) << "byte " << b << " (page " << int64_t(b) / ps << ", token "
                                             << int64_t(b) % ps / row_bytes << ", byte " << int64_t(b) % ps % row_bytes << ")";
    }
  }
}

TEST(InsertIndex, SlotBeyondCacheThrowsAndLeavesCacheUntouched) {
  const Source s = make_source(DType::bf16, 3, 1, 71);
  std::vector<uint16_t> buf(std::size_t(2) * N * D, 0x1234);
  const msa::IndexCacheView c{DType::bf16, buf.data(), 2, 128 * 128};
  const std::vector<int64_t> slots = {4, 1000, 256};
  expect_error([&] { msa::cpu::insert_index(c, {s.k.data(), DType::bf16, slots.data(), 3}); },
               "index slots[1] = 1000 but the cache has 2 pages (256 slots)");
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint16_t b) { return b == 0x1234; }));
}


// ---- input checks (src/core/check_insert.cpp) ------------------------------------------

// A valid fp8 e4m3 per-tensor insert, broken by `mutate`; the call must throw a
// message containing `needle` and leave the cache and the scales bit-identical.
template <typename Mutate>
void expect_kv_rejected(Mutate mutate, const std::string& needle) {
  SCOPED_TRACE(needle);
  const int H = 2, T = 6;
  const int64_t P = 2;
  const Source s = make_source(DType::bf16, T, H, 91);
  const std::vector<int64_t> slots = {0, 5, -1, 130, 255, 7};
  std::vector<uint8_t> buf(std::size_t(P) * H * N * 2 * D * 2);  // room for bf16 too
  std::mt19937 rng(92);
  for (auto& b : buf) b = uint8_t(rng());
  std::vector<float> ks(std::size_t(P) * N * H, 0.5f), vs = ks;
  const std::vector<uint8_t> before = buf;
  auto c = msa::make_cache_view(DType::fp8_e4m3, buf.data(), P, H, Layout::hnd);
  c.k_scales = ks.data();
  c.v_scales = vs.data();
  auto a = kv_args(s, slots);
  msa::cpu::insert_kv(c, a);
  buf = before;  // the valid call works; now break it
  mutate(c, a);
  expect_error([&] { msa::cpu::insert_kv(c, a); }, needle);
  EXPECT_TRUE(buf == before) << "cache changed by a failed call";
  EXPECT_TRUE(std::all_of(ks.begin(), ks.end(), [](float x) { return x == 0.5f; }));
  EXPECT_TRUE(std::all_of(vs.begin(), vs.end(), [](float x) { return x == 0.5f; }));
}


using Cache = msa::KVCacheView;
using Args = msa::InsertKVArgs;

TEST(InsertChecks, CacheView) {
  expect_kv_rejected([](Cache& c, Args&) { c.k = nullptr; }, "cache.k is null");
  expect_kv_rejected([](Cache& c, Args&) { c.v = nullptr; }, "cache.v is null");
  expect_kv_rejected([](Cache& c, Args&) { c.num_pages = -1; }, "cache.num_pages = -1");
  expect_kv_rejected([](Cache& c, Args&) { c.num_kv_heads = 0; }, "cache.num_kv_heads = 0");
  expect_kv_rejected([](Cache& c, Args&) { c.dtype = DType::f32; }, "cache.dtype = f32 is not a KV cache dtype");
  expect_kv_rejected([](Cache& c, Args&) { c.dtype = DType::i32; }, "cache.dtype = i32");
}

TEST(InsertChecks, ScaleModesThatDoNotGoWithTheDtype) {
  expect_kv_rejected([](Cache& c, Args&) { c.dtype = DType::bf16; },
                     "cache.scale_mode = per_tensor does not go with a bf16 cache");
  expect_kv_rejected(
      [](Cache& c, Args&) {
        c.dtype = DType::fp16;
        c.scale_mode = msa::ScaleMode::per_token_head;
      },
      "cache.scale_mode = per_token_head does not go with a fp16 cache");
  expect_kv_rejected([](Cache& c, Args&) { c.scale_mode = msa::ScaleMode::none; },
                     "cache.scale_mode = none does not go with a fp8_e4m3 cache");
  expect_kv_rejected([](Cache& c, Args&) { c.k_scale = 0.0f; }, "cache.k_scale = 0");
  expect_kv_rejected([](Cache& c, Args&) { c.v_scale = NAN; }, "cache.v_scale = nan");
  expect_kv_rejected([](Cache& c, Args&) { c.k_scale = -INFINITY; }, "cache.k_scale = -inf");
  expect_kv_rejected(
      [](Cache& c, Args&) {
        c.scale_mode = msa::ScaleMode::per_token_head;
        c.k_scales = nullptr;
      },
      "cache.k_scales is null but cache.scale_mode = per_token_head");
  expect_kv_rejected(
      [](Cache& c, Args&) {
        c.dtype = DType::fp8_e5m2;
        c.scale_mode = msa::ScaleMode::per_token_head;
        c.v_scales = nullptr;
      },
      "cache.v_scales is null");
}

TEST(InsertChecks, Nvfp4NeedsAnNvfp4View) {
  // A packed view relabelled nvfp4: separate K and V bases.
  expect_kv_rejected([](Cache& c, Args&) { c.dtype = DType::nvfp4; }, "cache.v differs from cache.k");
  // An nvfp4 view (2 pages of 2 heads fit in the test's buffer) with bad fields.
  const auto nv = [](Cache& c) {
    c = msa::make_nvfp4_cache_view(c.k, 2, 2, 1.0f, 1.0f);
  };
  expect_kv_rejected([&](Cache& c, Args&) { nv(c); c.scale_mode = msa::ScaleMode::per_token_head; },
                     "cache.scale_mode = per_token_head does not go with an nvfp4 cache");
  expect_kv_rejected([&](Cache& c, Args&) { nv(c); c.page_stride = 36863; },
                     "cache.page_stride = 36863 bytes is smaller than one nvfp4 page (36864 bytes");
  expect_kv_rejected([&](Cache& c, Args&) { nv(c); c.k_scale = INFINITY; }, "cache.k_scale = inf");
  expect_kv_rejected([&](Cache& c, Args&) { nv(c); c.v_scale = 0.0f; }, "cache.v_scale = 0");
  // The same nvfp4 view is accepted.
  expect_kv_rejected([&](Cache& c, Args& a) { nv(c); a.num_tokens = -1; }, "num_tokens = -1");
}

TEST(InsertChecks, Strides) {
  expect_kv_rejected([](Cache& c, Args&) { c.token_stride = 64; }, "cache.token_stride = 64 must be >= 128");
  expect_kv_rejected([](Cache& c, Args&) { c.head_stride = 100; }, "cache.head_stride = 100 must be >= 128");
  expect_kv_rejected([](Cache& c, Args&) { c.head_stride = 256; },  // HND heads on top of tokens
                     "cache.token_stride = 256 and cache.head_stride = 256 make rows overlap: K[h=0, t=1] at "
                     "element 256 and K[h=1, t=0] at element 256 of a page");
  expect_kv_rejected(
      [](Cache& c, Args&) {  // NHD with the token stride of one head
        c.head_stride = 256;
        c.token_stride = 384;
      },
      "cache.v starts 128 elements after cache.k, so K and V rows overlap: K[h=0, t=1] at element 384 and "
      "V[h=1, t=0] at element 384 of a page");
  expect_kv_rejected([](Cache& c, Args&) { c.page_stride -= 1; },
                     "cache.page_stride = 65535 is smaller than the 65536 elements one page of K and V spans");
  expect_kv_rejected([](Cache& c, Args&) { c.v = c.k; }, "cache.v starts 0 elements after cache.k");
  expect_kv_rejected([](Cache& c, Args&) { c.v = static_cast<uint8_t*>(c.k) + 64; },
                     "cache.v starts 64 elements after cache.k, so K and V rows overlap");
  expect_kv_rejected([](Cache& c, Args&) { c.v = static_cast<uint8_t*>(c.k) + 200; },
                     "cache.v starts 200 elements after cache.k, so K and V rows overlap");
  // Separate K and V allocations are fine: V before K here.
  expect_kv_rejected(
      [](Cache& c, Args& a) {
        std::swap(c.k, c.v);
        a.num_tokens = -2;
      },
      "num_tokens = -2");
}

TEST(InsertChecks, Arguments) {
  expect_kv_rejected([](Cache&, Args& a) { a.num_tokens = -3; }, "num_tokens = -3 must be >= 0");
  expect_kv_rejected([](Cache&, Args& a) { a.src_dtype = DType::fp8_e4m3; },
                     "src_dtype = fp8_e4m3 is not an insert source dtype (expected bf16 or fp16)");
  expect_kv_rejected([](Cache&, Args& a) { a.src_dtype = DType::f32; }, "src_dtype = f32");
  expect_kv_rejected([](Cache&, Args& a) { a.k = nullptr; }, "k is null with num_tokens = 6");
  expect_kv_rejected([](Cache&, Args& a) { a.v = nullptr; }, "v is null with num_tokens = 6");
  expect_kv_rejected([](Cache&, Args& a) { a.slots = nullptr; }, "slots is null with num_tokens = 6");
  static const std::int64_t bad[6] = {0, 1, 2, 3, 4, 256};
  expect_kv_rejected([](Cache&, Args& a) { a.slots = bad; },
                     "slots[5] = 256 but the cache has 2 pages (256 slots)");
  expect_kv_rejected([](Cache& c, Args&) { c.num_pages = 1; },
                     "slots[3] = 130 but the cache has 1 pages (128 slots)");
  // Nothing to insert: no pointers needed.
  msa::cpu::insert_kv(msa::make_cache_view(DType::bf16, nullptr, 0, 1, Layout::hnd), Args{});
}

TEST(InsertChecks, SlotsDataDirect) {
  const std::int64_t slots[3] = {-5, 383, 384};
  EXPECT_NO_THROW(msa::check::slots_data(slots, 2, 3, "slots"));
  expect_error([&] { msa::check::slots_data(slots, 3, 3, "my_slots"); },
               "my_slots[2] = 384 but the cache has 3 pages (384 slots)");
  expect_error([&] { msa::check::slots_data(nullptr, 3, 3, "my_slots"); },
               "my_slots is null with num_tokens = 3");
}

// An index insert broken by `mutate`: throws `needle`, cache untouched.
template <typename Mutate>
void expect_index_rejected(Mutate mutate, const std::string& needle) {
  SCOPED_TRACE(needle);
  const Source s = make_source(DType::fp16, 3, 1, 93);
  const std::vector<int64_t> slots = {3, -1, 200};
  std::vector<uint16_t> buf(std::size_t(2) * N * D, 0x4321);
  msa::IndexCacheView c{DType::bf16, buf.data(), 2, 128 * 128};
  msa::InsertIndexArgs a{s.k.data(), DType::fp16, slots.data(), 3};
  mutate(c, a);
  expect_error([&] { msa::cpu::insert_index(c, a); }, needle);
  EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](uint16_t b) { return b == 0x4321; }));
}

TEST(InsertChecks, IndexCache) {
  using C = msa::IndexCacheView;
  using A = msa::InsertIndexArgs;
  expect_index_rejected([](C& c, A&) { c.dtype = DType::fp16; },
                        "index_cache.dtype = fp16 is not an index cache dtype (expected bf16, fp8_e4m3 or nvfp4)");
  expect_index_rejected([](C& c, A&) { c.dtype = DType::fp8_e5m2; }, "index_cache.dtype = fp8_e5m2");
  // nvfp4: page stride in bytes, at least one 9,216-byte page; a positive finite global scale.
  const auto nv = [](C& c) { c = msa::make_index_cache_view(DType::nvfp4, c.base, 2, 0, 0.5f); };
  expect_index_rejected([&](C& c, A&) { nv(c); c.page_stride = 9215; },
                        "index_cache.page_stride = 9215 is smaller than one page (9216 bytes)");
  expect_index_rejected([&](C& c, A&) { nv(c); c.global_scale = 0.0f; },
                        "index_cache.global_scale = 0 must be finite and positive");
  expect_index_rejected([&](C& c, A&) { nv(c); c.global_scale = NAN; }, "index_cache.global_scale = nan");
  expect_index_rejected([&](C& c, A&) { nv(c); c.global_scale = -INFINITY; }, "index_cache.global_scale = -inf");
  expect_index_rejected([&](C& c, A&) { nv(c); c.num_pages = 1; },
                        "index slots[2] = 200 but the cache has 1 pages (128 slots)");
  // The global scale matters to nvfp4 only.
  expect_index_rejected([](C& c, A& a) { c.global_scale = 0.0f; a.num_tokens = -1; }, "num_tokens = -1");
  expect_index_rejected([](C& c, A&) { c.base = nullptr; }, "index_cache.base is null");
  expect_index_rejected([](C& c, A&) { c.num_pages = -1; }, "index_cache.num_pages = -1");
  expect_index_rejected([](C& c, A&) { c.page_stride = 1000; },
                        "index_cache.page_stride = 1000 is smaller than one page (16384 elements)");
  expect_index_rejected([](C&, A& a) { a.src_dtype = DType::fp8_e4m3; },
                        "src_dtype = fp8_e4m3 is not an index-key source dtype");
  expect_index_rejected([](C&, A& a) { a.num_tokens = -1; }, "num_tokens = -1");
  expect_index_rejected([](C&, A& a) { a.index_k = nullptr; }, "index_k is null with num_tokens = 3");
  expect_index_rejected([](C&, A& a) { a.slots = nullptr; }, "slots is null with num_tokens = 3");
  expect_index_rejected([](C& c, A&) { c.num_pages = 1; },
                        "index slots[2] = 200 but the cache has 1 pages (128 slots)");
}

}  // namespace
