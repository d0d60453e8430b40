// GPU insert against the CPU engine: the cache bytes (and per-(token, head)
// scales) written by cuda::insert_kv / insert_index must be bit-identical to
// cpu::insert_kv / insert_index for every cache dtype, layout, scale mode,
// source dtype and page stride, including nvfp4 head-slot pages. Bad slots are
// skipped, recorded by the DeviceCheck, and nothing lands outside the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/cuda.hpp"
#include "msa/numeric.hpp"

namespace {

using msa::DType;
using msa::KVCacheView;
using msa::Layout;
using msa::ScaleMode;
using msa::test::DeviceBuffer;

constexpr std::size_t kGuardBytes = 4096;  // checked after the cache extent
constexpr std::uint8_t kPoison = 0xA5;

// n bf16/fp16 values: unit normals times `spread`, with a few specials
// (zeros, huge values, +-inf, NaN) when `specials`.
std::vector<std::uint16_t> random_half(std::size_t n, DType dtype, float spread, bool specials,
                                       std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::uniform_int_distribution<int> pick(0, 199);
  std::vector<std::uint16_t> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    float x = normal(rng);
    if (specials) {
      const int r = pick(rng);
      if (r == 0) x = 0.0f;
      else if (r == 1) x = -0.0f;
      else if (r == 2) x = 1.0e4f * (x < 0 ? -1.0f : 1.0f);
      else if (r == 3) x = std::numeric_limits<float>::infinity();
      else if (r == 4) x = -std::numeric_limits<float>::infinity();
      else if (r == 5) x = std::numeric_limits<float>::quiet_NaN();
      else if (r == 6) x *= 1.0e-6f;
    }
    out[i] = dtype == DType::bf16 ? msa::num::float_to_bf16(x) : msa::num::float_to_fp16(x);
  }
  return out;
}

// Zeroes whole rows [128] of a few (token, head) pairs (amax 0 cases).
void zero_some_rows(std::vector<std::uint16_t>& x, std::mt19937_64& rng) {
  const std::size_t rows = x.size() / msa::kHeadDim;
  for (std::size_t i = 0; i < rows; i += 1 + rng() % 9) {
    std::fill(x.begin() + i * msa::kHeadDim, x.begin() + (i + 1) * msa::kHeadDim, std::uint16_t{0});
  }
}

// Distinct random slots in [0, num_pages * 128), about 1 in 8 replaced by a
// negative value (padding).
std::vector<std::int64_t> random_slots(std::int64_t num_tokens, std::int64_t num_pages,
                                       std::mt19937_64& rng) {
  std::vector<std::int64_t> all(num_pages * msa::kBlockSize);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::int64_t(i);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::int64_t> slots(all.begin(), all.begin() + num_tokens);
  for (auto& s : slots) {
    if (rng() % 8 == 0) s = -1 - std::int64_t(rng() % 1000);
  }
  return slots;
}

std::string first_byte_mismatch(const std::vector<std::uint8_t>& got,
                                const std::vector<std::uint8_t>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return msa::detail::concat("first mismatching byte ", i, " of ", want.size(), ": got 0x",
                                 std::hex, int(got[i]), " want 0x", int(want[i]));
    }
  }
  return "";
}

std::string first_float_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (msa::num::float_bits(got[i]) != msa::num::float_bits(want[i])) {
      return msa::detail::concat("first mismatching scale ", i, " of ", want.size(), ": got ",
                                 got[i], " want ", want[i]);
    }
  }
  return "";
}

struct KVCase {
  DType dtype = DType::bf16;
  Layout layout = Layout::hnd;
  ScaleMode scales = ScaleMode::none;
  DType src = DType::bf16;
  int num_kv_heads = 1;
  std::int64_t num_pages = 5;
  std::int64_t num_tokens = 37;
  std::int64_t page_pad = 0;  // extra elements (bytes for nvfp4) per page
  std::uint64_t seed = 1;
  bool bad_slot = false;      // put one slot beyond the cache
  std::string name() const {
    return msa::detail::concat(msa::dtype_name(dtype), "/", msa::layout_name(layout), "/scales=",
                               int(scales), "/src=", msa::dtype_name(src), "/H=", num_kv_heads,
                               "/pages=", num_pages, "/tokens=", num_tokens, "/pad=", page_pad,
                               "/seed=", seed);
  }
};

// Builds the view over `base` for a case (host or device memory alike).
KVCacheView view_for(const KVCase& c, void* base, float* k_scales, float* v_scales) {
  KVCacheView v;
  if (c.dtype == DType::nvfp4) {
    const std::int64_t compact = 2 * c.num_kv_heads * msa::nvfp4::kSlotBytes;
    v = msa::make_nvfp4_cache_view(base, c.num_pages, c.num_kv_heads, 1.0f / 64.0f, 1.0f / 512.0f,
                                   c.page_pad ? compact + c.page_pad : 0);
  } else {
    const std::int64_t compact = std::int64_t(c.num_kv_heads) * msa::kBlockSize * 2 * msa::kHeadDim;
    v = msa::make_cache_view(c.dtype, base, c.num_pages, c.num_kv_heads, c.layout,
                             c.page_pad ? compact + c.page_pad : 0);
    v.scale_mode = c.scales;
    if (c.scales == ScaleMode::per_tensor) {
      v.k_scale = 1.0f / 48.0f;
      v.v_scale = 0.75f;
    }
    if (c.scales == ScaleMode::per_token_head) {
      v.k_scales = k_scales;
      v.v_scales = v_scales;
    }
  }
  return v;
}

void run_kv_case(const KVCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937_64 rng(c.seed);
  const std::int64_t H = c.num_kv_heads;
  const std::size_t n = std::size_t(c.num_tokens * H * msa::kHeadDim);
  std::vector<std::uint16_t> k = random_half(n, c.src, 1.0f, true, rng);
  std::vector<std::uint16_t> v = random_half(n, c.src, 3.0f, true, rng);
  zero_some_rows(k, rng);
  std::vector<std::int64_t> slots = random_slots(c.num_tokens, c.num_pages, rng);
  std::int64_t bad_index = -1;
  if (c.bad_slot) {
    bad_index = c.num_tokens / 2;
    slots[bad_index] = c.num_pages * msa::kBlockSize + 17;
  }

  // Host cache: extent + guard, poisoned; the device cache starts identical.
  // (the extent is measured on a view over a dummy aligned base: only offsets matter)
  const std::size_t eb = c.dtype == DType::nvfp4 ? 1 : msa::dtype_bytes(c.dtype);
  const KVCacheView probe = view_for(c, reinterpret_cast<void*>(std::uintptr_t{4096}), nullptr, nullptr);
  const std::size_t cache_bytes = std::size_t(msa::cache_extent(probe)) * eb;
  std::vector<std::uint8_t> host_cache(cache_bytes + kGuardBytes, kPoison);
  const std::size_t num_scales = std::size_t(c.num_pages * msa::kBlockSize * H);
  std::vector<float> host_ks(num_scales, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> host_vs(num_scales, std::numeric_limits<float>::quiet_NaN());

  DeviceBuffer<std::uint8_t> dev_cache(host_cache);
  DeviceBuffer<float> dev_ks(host_ks), dev_vs(host_vs);
  DeviceBuffer<std::uint16_t> dev_k(k), dev_v(v);
  DeviceBuffer<std::int64_t> dev_slots(slots);

  msa::InsertKVArgs args;
  args.k = k.data();
  args.v = v.data();
  args.src_dtype = c.src;
  args.slots = slots.data();
  args.num_tokens = c.num_tokens;
  msa::cpu::Options opt;
  opt.check = !c.bad_slot;  // the CPU engine skips the bad slot unchecked
  msa::cpu::insert_kv(view_for(c, host_cache.data(), host_ks.data(), host_vs.data()), args, opt);

  msa::test::CheckBuffer check;
  args.k = dev_k.data();
  args.v = dev_v.data();
  args.slots = dev_slots.data();
  msa::cuda::insert_kv(view_for(c, dev_cache.data(), dev_ks.data(), dev_vs.data()), args, nullptr,
                       check.get());
  msa::test::device_sync();

  const std::vector<std::uint8_t> got = dev_cache.download();
  EXPECT_TRUE(got == host_cache) << first_byte_mismatch(got, host_cache);
  for (std::size_t i = cache_bytes; i < got.size(); ++i) {
    ASSERT_EQ(got[i], kPoison) << "byte " << i - cache_bytes << " past the cache extent was written";
  }
  if (c.scales == ScaleMode::per_token_head) {
    const auto ks = dev_ks.download(), vs = dev_vs.download();
    EXPECT_EQ(first_float_mismatch(ks, host_ks), "") << "k_scales";
    EXPECT_EQ(first_float_mismatch(vs, host_vs), "") << "v_scales";
  }
  const std::string msg = check.message();
  if (c.bad_slot) {
    const std::string want = msa::detail::concat("slots[", bad_index, "] = ", slots[bad_index],
                                                 " beyond the cache (", c.num_pages, " pages)");
    EXPECT_EQ(msg, want);
  } else {
    EXPECT_EQ(msg, "");
  }
}

TEST(CudaInsert, KVEveryDtypeLayoutScaleMode) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(101);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  const DType dtypes[] = {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2};
  const Layout layouts[] = {Layout::hnd, Layout::nhd, Layout::split};
  for (DType dt : dtypes) {
    std::vector<ScaleMode> modes = {ScaleMode::none};
    if (msa::is_fp8(dt)) modes = {ScaleMode::per_tensor, ScaleMode::per_token_head};
    for (Layout layout : layouts) {
      for (ScaleMode mode : modes) {
        for (DType src : {DType::bf16, DType::fp16}) {
          for (std::int64_t pad : {std::int64_t(0), std::int64_t(136), std::int64_t(3)}) {
            KVCase c;
            c.dtype = dt;
            c.layout = layout;
            c.scales = mode;
            c.src = src;
            c.num_kv_heads = pad ? 3 : 2;
            c.num_pages = pad ? 3 : 4;
            c.num_tokens = pad ? 129 : 37;
            c.page_pad = pad;
            c.seed = s++;
            run_kv_case(c);
          }
        }
      }
    }
  }
}

TEST(CudaInsert, KVNvfp4HeadSlotPages) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(202);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  for (int heads : {1, 4}) {
    for (DType src : {DType::bf16, DType::fp16}) {
      for (std::int64_t pad : {std::int64_t(0), std::int64_t(202)}) {
        KVCase c;
        c.dtype = DType::nvfp4;
        c.src = src;
        c.num_kv_heads = heads;
        c.num_pages = 3;
        c.num_tokens = 301;
        c.page_pad = pad;
        c.seed = s++;
        run_kv_case(c);
      }
    }
  }
}

TEST(CudaInsert, KVLargeM3Shape) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(303);
  MSA_TRACE_SEED(seed);
  KVCase c;
  c.dtype = DType::fp8_e4m3;
  c.scales = ScaleMode::per_token_head;
  c.num_kv_heads = 4;
  c.num_pages = msa::test::size_for<std::int64_t>(40, 3);
  c.num_tokens = msa::test::size_for<std::int64_t>(4097, 129);
  c.seed = seed;
  run_kv_case(c);
  c.dtype = DType::nvfp4;
  c.scales = ScaleMode::none;
  run_kv_case(c);
}

TEST(CudaInsert, KVBadSlotIsSkippedAndRecorded) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(404);
  MSA_TRACE_SEED(seed);
  for (DType dt : {DType::bf16, DType::fp8_e5m2, DType::nvfp4}) {
    KVCase c;
    c.dtype = dt;
    c.scales = msa::is_fp8(dt) ? ScaleMode::per_token_head : ScaleMode::none;
    c.num_kv_heads = 2;
    c.num_pages = 2;
    c.num_tokens = 50;
    c.seed = seed;
    c.bad_slot = true;
    run_kv_case(c);
  }
}

struct IndexCase {
  DType dtype = DType::bf16;
  DType src = DType::bf16;
  std::int64_t num_pages = 3;
  std::int64_t num_tokens = 200;
  std::int64_t page_pad = 0;  // elements past a page (bytes for nvfp4)
  float global_scale = 1.0f;  // nvfp4 only
  std::uint64_t seed = 1;
  bool bad_slot = false;
};

void run_index_case(const IndexCase& c) {
  SCOPED_TRACE(msa::detail::concat("index ", msa::dtype_name(c.dtype), " src=", msa::dtype_name(c.src),
                                   " pad=", c.page_pad, " global_scale=", c.global_scale, " seed=", c.seed));
  std::mt19937_64 rng(c.seed);
  std::vector<std::uint16_t> x = random_half(std::size_t(c.num_tokens) * msa::kHeadDim, c.src, 2.0f,
                                             true, rng);
  if (c.dtype == DType::nvfp4) {
    zero_some_rows(x, rng);
    // Group 3 of every fifth token tiny: its scale sits at the 2^-9 floor.
    for (std::int64_t t = 0; t < c.num_tokens; t += 5)
      for (int e = 48; e < 64; ++e) {
        const float v = (e % 3 - 1) * 1e-6f * float(e);
        x[std::size_t(t) * msa::kHeadDim + e] = c.src == DType::bf16 ? msa::num::float_to_bf16(v) : msa::num::float_to_fp16(v);
      }
  }
  std::vector<std::int64_t> slots = random_slots(c.num_tokens, c.num_pages, rng);
  std::int64_t bad_index = -1;
  if (c.bad_slot) {
    bad_index = c.num_tokens - 3;
    slots[bad_index] = c.num_pages * msa::kBlockSize;
  }
  const bool nvfp4 = c.dtype == DType::nvfp4;
  const std::int64_t compact = nvfp4 ? msa::index_nvfp4::kPageBytes : std::int64_t(msa::kBlockSize) * msa::kHeadDim;
  msa::IndexCacheView view =
      msa::make_index_cache_view(c.dtype, nullptr, c.num_pages, compact + c.page_pad, nvfp4 ? c.global_scale : 1.0f);
  const std::size_t bytes = std::size_t(c.num_pages * view.page_stride) * (nvfp4 ? 1 : msa::dtype_bytes(c.dtype));
  std::vector<std::uint8_t> host(bytes + kGuardBytes, kPoison);
  DeviceBuffer<std::uint8_t> dev(host);
  DeviceBuffer<std::uint16_t> dev_x(x);
  DeviceBuffer<std::int64_t> dev_slots(slots);

  msa::InsertIndexArgs args;
  args.index_k = x.data();
  args.src_dtype = c.src;
  args.slots = slots.data();
  args.num_tokens = c.num_tokens;
  msa::cpu::Options opt;
  opt.check = !c.bad_slot;
  view.base = host.data();
  msa::cpu::insert_index(view, args, opt);

  msa::test::CheckBuffer check;
  args.index_k = dev_x.data();
  args.slots = dev_slots.data();
  view.base = dev.data();
  msa::cuda::insert_index(view, args, nullptr, check.get());
  msa::test::device_sync();
  const auto got = dev.download();
  EXPECT_TRUE(got == host) << first_byte_mismatch(got, host);
  if (c.bad_slot) {
    EXPECT_EQ(check.message(), msa::detail::concat("slots[", bad_index, "] = ", slots[bad_index],
                                                   " beyond the cache (", c.num_pages, " pages)"));
  } else {
    EXPECT_EQ(check.message(), "");
  }
}

TEST(CudaInsert, IndexKeysBf16AndFp8) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(505);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  for (DType dt : {DType::bf16, DType::fp8_e4m3}) {
    for (DType src : {DType::bf16, DType::fp16}) {
      for (std::int64_t pad : {std::int64_t(0), std::int64_t(8), std::int64_t(3)}) {
        IndexCase c;
        c.dtype = dt;
        c.src = src;
        c.page_pad = pad;
        c.num_tokens = pad == 3 ? 255 : 200;
        c.seed = s++;
        run_index_case(c);
      }
    }
  }
  IndexCase bad;
  bad.seed = s;
  bad.bad_slot = true;
  run_index_case(bad);
}

// nvfp4 index rows ([page][token][72 bytes]): every byte as cpu::insert_index
// writes it, with specials (zeros, huge groups that saturate the scale, +-inf,
// NaN, tiny values at the scale floor), byte strides that leave rows unaligned,
// a power-of-two and an odd global scale.
TEST(CudaInsert, IndexKeysNvfp4) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(507);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  for (DType src : {DType::bf16, DType::fp16}) {
    for (std::int64_t pad : {std::int64_t(0), std::int64_t(64), std::int64_t(5)}) {
      for (float global : {1.0f / 256.0f, 0.0173f}) {
        IndexCase c;
        c.dtype = DType::nvfp4;
        c.src = src;
        c.page_pad = pad;
        c.global_scale = global;
        c.num_pages = pad == 5 ? 4 : 3;
        c.num_tokens = pad == 5 ? 255 : 201;  // odd: the last half-warp of a block is alone
        c.seed = s++;
        run_index_case(c);
      }
    }
  }
  IndexCase bad;
  bad.dtype = DType::nvfp4;
  bad.global_scale = 0.01f;
  bad.seed = s;
  bad.bad_slot = true;
  run_index_case(bad);
}

// insert_kv and insert_index allocate nothing and never synchronize: captured
// in a CUDA graph, a replay writes the same bytes as a direct call.
TEST(CudaInsert, CapturedInCudaGraph) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(606);
  MSA_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  const int H = 2;
  const std::int64_t pages = 3, tokens = 100;
  const auto k = random_half(std::size_t(tokens * H * msa::kHeadDim), DType::bf16, 1.0f, false, rng);
  const auto v = random_half(k.size(), DType::bf16, 1.0f, false, rng);
  const auto slots = random_slots(tokens, pages, rng);
  DeviceBuffer<std::uint16_t> dk(k), dv(v);
  DeviceBuffer<std::int64_t> ds(slots);
  const std::size_t bytes = std::size_t(pages) * H * 128 * 256;
  DeviceBuffer<std::uint8_t> direct(bytes), graphed(bytes), index_cache(std::size_t(pages) * 128 * 128);
  DeviceBuffer<float> ks(std::size_t(pages) * 128 * H), vs(std::size_t(pages) * 128 * H);
  direct.fill_bytes(kPoison);
  graphed.fill_bytes(kPoison);
  index_cache.fill_bytes(kPoison);
  msa::InsertKVArgs args;
  args.k = dk.data();
  args.v = dv.data();
  args.slots = ds.data();
  args.num_tokens = tokens;
  auto view = [&](void* base) {
    KVCacheView c = msa::make_cache_view(DType::fp8_e4m3, base, pages, H, Layout::nhd);
    c.scale_mode = ScaleMode::per_token_head;
    c.k_scales = ks.data();
    c.v_scales = vs.data();
    return c;
  };
  msa::cuda::insert_kv(view(direct.data()), args, nullptr);
  msa::test::device_sync();

  msa::IndexCacheView ic;
  ic.dtype = DType::fp8_e4m3;
  ic.base = index_cache.data();
  ic.num_pages = pages;
  msa::InsertIndexArgs iargs;
  iargs.index_k = dk.data();  // any [tokens, 128] rows will do
  iargs.slots = ds.data();
  iargs.num_tokens = tokens;

  msa::test::CheckBuffer check;
  cudaStream_t stream;
  MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  msa::cuda::reset_check(check.get(), stream);
  msa::cuda::insert_kv(view(graphed.data()), args, stream, check.get());
  msa::cuda::insert_index(ic, iargs, stream, check.get());
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto a = direct.download(), b = graphed.download();
  EXPECT_TRUE(a == b) << first_byte_mismatch(b, a);
  EXPECT_EQ(check.message(), "");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

TEST(CudaInsert, EmptyAndAllPaddingDoNothing) {
  MSA_SKIP_WITHOUT_GPU();
  KVCase c;
  c.num_tokens = 0;
  run_kv_case(c);
  // Every slot negative: the cache stays poisoned.
  DeviceBuffer<std::uint8_t> cache(std::size_t(2) * 128 * 256 * 2);
  cache.fill_bytes(kPoison);
  std::vector<std::int64_t> slots(9, -1);
  DeviceBuffer<std::int64_t> dev_slots(slots);
  DeviceBuffer<std::uint16_t> kv(std::size_t(9) * 128);
  kv.zero();
  msa::InsertKVArgs args;
  args.k = kv.data();
  args.v = kv.data();
  args.slots = dev_slots.data();
  args.num_tokens = 9;
  msa::cuda::insert_kv(msa::make_cache_view(DType::bf16, cache.data(), 2, 1, Layout::hnd), args,
                       nullptr);
  msa::test::device_sync();
  const auto got = cache.download();
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](std::uint8_t b) { return b == kPoison; }));
}

}  // namespace
