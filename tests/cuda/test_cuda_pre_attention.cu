// GPU pre-attention against the CPU engine (contract 10). The kernel is
// designed to be bit-identical to cpu::pre_attention (the SEMANTICS of
// msa/pre_attention.hpp fix every rounding), so every output is compared byte
// for byte: q and index q (and, for 16-bit outputs, the largest distance in
// ulps, which the target allows up to 1), the whole KV cache (V rows
// included, per-token scales too) and the index cache, and nothing past the
// caches is written, for each of the two kernels. Every KV dtype, layout,
// scale mode and page stride, both qkv dtypes, every output, weight and table
// dtype, odd token counts, skipped slots, unaligned rows; bad slots and
// positions are skipped and recorded; the call replays from a CUDA graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/pre_attention/kernel_choice.hpp"
#include "gpu_test_util.hpp"
#include "msa/cache.hpp"
#include "msa/cpu.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"
#include "msa/pre_attention.hpp"
#include "pre_attention_inputs.hpp"

namespace {

using msa::DType;
using msa::Layout;
using msa::ScaleMode;
using msa::test::DeviceBuffer;
using Case = msa::test::PreAttentionCase;
using Inputs = msa::test::PreAttentionInputs;
using Kernel = msa::cuda::pre_detail::Kernel;


// The device copy of a call's buffers, and the views and arguments over it.
struct DeviceCall {
  DeviceBuffer<std::uint16_t> qkv;
  DeviceBuffer<std::uint8_t> weights[4], cos_sin, cache, index_cache, q, iq;
  DeviceBuffer<std::int64_t> positions, slots, index_slots;
  DeviceBuffer<float> k_scales, v_scales;
  msa::KVCacheView view;
  msa::IndexCacheView index_view;
  msa::PreAttentionArgs args;

  explicit DeviceCall(Inputs& in)
      : qkv(in.qkv), cos_sin(in.cos_sin), cache(in.cache), index_cache(in.index_cache), q(in.q), iq(in.iq),
        positions(in.positions), slots(in.slots), index_slots(in.index_slots), k_scales(in.k_scales),
        v_scales(in.v_scales) {
    for (int k = 0; k < 4; ++k) weights[k] = DeviceBuffer<std::uint8_t>(in.weights[k]);
    view = in.view(cache.data(), k_scales.data(), v_scales.data());
    index_view = in.index_view(index_cache.data());
    args = in.args();
    args.qkv = qkv.data();
    args.positions = positions.data();
    args.q_weight = weights[0].data();
    args.k_weight = weights[1].data();
    args.index_q_weight = weights[2].data();
    args.index_k_weight = weights[3].data();
    args.cos_sin = cos_sin.data();
    args.q = q.data();
    args.index_q = iq.data();
    args.slots = slots.data();
    args.index_slots = in.c.own_index_slots ? index_slots.data() : nullptr;
  }
  void run(const msa::cuda::DeviceCheck& check, Kernel kernel = Kernel::automatic) {
    msa::cuda::pre_detail::pre_attention_with(kernel, view, index_view, args, nullptr, check);
    msa::test::device_sync();
  }
};

std::string first_difference(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want,
                             std::size_t limit) {
  for (std::size_t i = 0; i < std::min(limit, want.size()); ++i)
    if (got[i] != want[i])
      return msa::detail::concat("byte ", i, " of ", want.size(), ": gpu 0x", std::hex, int(got[i]), " cpu 0x",
                                 int(want[i]));
  return "";
}

// 16-bit outputs: the elements that differ, and the largest distance in ulps
// (codes of the same sign are ordered like their values).
struct UlpDiff {
  std::int64_t differ = 0;
  int max_ulps = 0;
  std::int64_t worst = -1;
};
UlpDiff ulp_diff(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want) {
  UlpDiff r;
  for (std::size_t i = 0; i + 1 < want.size(); i += 2) {
    std::uint16_t g, w;
    std::memcpy(&g, &got[i], 2);
    std::memcpy(&w, &want[i], 2);
    if (g == w) continue;
    ++r.differ;
    const int ulps = (g ^ w) & 0x8000 ? 1 << 16 : std::abs(int(g) - int(w));
    if (ulps > r.max_ulps) {
      r.max_ulps = ulps;
      r.worst = std::int64_t(i / 2);
    }
  }
  return r;
}

void expect_output(const char* what, DType dtype, const std::vector<std::uint8_t>& got,
                   const std::vector<std::uint8_t>& want) {
  if (dtype == DType::fp8_e4m3) {
    EXPECT_EQ(first_difference(got, want, want.size()), "") << what;
    return;
  }
  const UlpDiff d = ulp_diff(got, want);
  EXPECT_LE(d.max_ulps, 1) << what << ": element " << d.worst << " is " << d.max_ulps << " ulps off";
  EXPECT_EQ(d.differ, 0) << what << ": " << d.differ << " elements differ (at most " << d.max_ulps
                         << " ulp) where the kernel should be bit-identical";
}

// One GPU kernel's outputs for the case against the CPU engine's (`cpu`).
void compare_kernel(const Case& c, const std::string& expect_recorded, Inputs& in, const Inputs& cpu,
                    Kernel kernel) {
  DeviceCall dev(in);
  msa::test::CheckBuffer check;
  dev.run(check.get(), kernel);
  EXPECT_EQ(check.message(), expect_recorded);

  expect_output("q", c.q, dev.q.download(), cpu.q);
  expect_output("index q", c.iq, dev.iq.download(), cpu.iq);
  const std::vector<std::uint8_t> cache = dev.cache.download(), index_cache = dev.index_cache.download();
  EXPECT_EQ(first_difference(cache, cpu.cache, cpu.cache_bytes()), "") << "KV cache";
  EXPECT_EQ(first_difference(index_cache, cpu.index_cache, index_cache.size()), "") << "index cache";
  for (std::size_t b = cpu.cache_bytes(); b < cache.size(); ++b)
    ASSERT_EQ(cache[b], msa::test::kPreAttentionPoison) << "byte " << b - cpu.cache_bytes() << " past the cache";
  if (c.scales == ScaleMode::per_token_head) {
    const auto ks = dev.k_scales.download(), vs = dev.v_scales.download();
    EXPECT_EQ(0, std::memcmp(ks.data(), cpu.k_scales.data(), 4 * ks.size())) << "k_scales";
    EXPECT_EQ(0, std::memcmp(vs.data(), cpu.v_scales.data(), 4 * vs.size())) << "v_scales";
  }
}

// Runs the case on the CPU engine and on each GPU kernel and compares
// everything; `expect_recorded` is what the DeviceCheck should say ("" for nothing).
void run_case(const Case& c, const std::string& expect_recorded = "", Inputs* prepared = nullptr) {
  SCOPED_TRACE(c.name());
  Inputs in = prepared ? *prepared : msa::test::make_pre_attention_inputs(c);
  Inputs cpu = in;
  msa::cpu::Options opt;
  opt.check = expect_recorded.empty();  // bad entries: the CPU engine skips them unchecked
  msa::cpu::pre_attention(cpu.view(cpu.cache.data(), cpu.k_scales.data(), cpu.v_scales.data()),
                          cpu.index_view(cpu.index_cache.data()), cpu.args(), opt);
  for (Kernel kernel : {Kernel::warps, Kernel::strided, Kernel::staged}) {
    SCOPED_TRACE(kernel == Kernel::warps     ? "warps' kernel"
                 : kernel == Kernel::strided ? "warps' kernel, strided passes"
                                             : "staged kernel");
    compare_kernel(c, expect_recorded, in, cpu, kernel);
  }
}

struct Flavor {
  DType dtype;
  ScaleMode scales;
};
constexpr Flavor kFlavors[] = {{DType::bf16, ScaleMode::none},
                               {DType::fp16, ScaleMode::none},
                               {DType::fp8_e4m3, ScaleMode::per_tensor},
                               {DType::fp8_e4m3, ScaleMode::per_token_head},
                               {DType::fp8_e5m2, ScaleMode::per_tensor},
                               {DType::fp8_e5m2, ScaleMode::per_token_head},
                               {DType::nvfp4, ScaleMode::per_tensor}};

TEST(CudaPreAttention, EveryCacheLayoutAndOutputDtype) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(3401);
  MSA_TRACE_SEED(seed);
  std::uint64_t s = seed;
  int n = 0;
  const DType tables[] = {DType::f32, DType::bf16, DType::fp16};
  const std::int64_t tokens[] = {1, 37, 129, 255};
  static constexpr int kHeads[][3] = {{16, 1, 1}, {4, 2, 2}, {3, 1, 2}, {8, 3, 3}, {64, 4, 4}};
  for (const Flavor& f : kFlavors) {
    for (Layout layout : {Layout::hnd, Layout::nhd, Layout::split}) {
      if (f.dtype == DType::nvfp4 && layout != Layout::hnd) continue;
      for (DType src : {DType::bf16, DType::fp16}) {
        for (int variant = 0; variant < 2; ++variant, ++n) {
          Case c;
          c.src = src;
          c.kv = f.dtype;
          c.scales = f.scales;
          c.layout = layout;
          c.page_pad = variant ? (f.dtype == DType::nvfp4 ? 4096 : (n % 4 == 1 ? 3 : 1000)) : 0;
          c.index = n % 3 == 1 ? DType::bf16 : (n % 3 == 2 ? DType::nvfp4 : DType::fp8_e4m3);
          c.q = n % 3 == 0 ? DType::fp8_e4m3 : (n % 3 == 1 ? src : (src == DType::bf16 ? DType::fp16 : DType::bf16));
          c.iq = c.index == DType::fp8_e4m3 && n % 2 ? DType::fp8_e4m3 : (n % 4 == 0 ? DType::fp16 : src);
          c.weight = tables[n % 3];
          c.table = tables[(n / 3) % 3];
          c.nq = kHeads[n % 5][0];
          c.nkv = kHeads[n % 5][1];
          c.niq = kHeads[n % 5][2];
          c.tokens = tokens[n % 4];
          c.row_pad = n % 5 == 2 ? 24 : (n % 7 == 3 ? 3 : 0);  // 3: rows not 16-byte aligned
          c.own_index_slots = n % 2 == 0;
          c.seed = s++;
          run_case(c);
        }
      }
    }
  }
}

// MiniMax-M3 per-rank shapes at prefill sizes.
TEST(CudaPreAttention, M3ShapesManyTokens) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(3402);
  MSA_TRACE_SEED(seed);
  Case c;
  c.nq = 64;
  c.nkv = 4;
  c.niq = 4;
  c.tokens = msa::test::size_for<std::int64_t>(2049, 129);
  c.kv = DType::fp8_e4m3;
  c.scales = ScaleMode::per_token_head;
  c.index = DType::fp8_e4m3;
  c.q = DType::fp8_e4m3;
  c.iq = DType::fp8_e4m3;
  c.seed = seed;
  run_case(c);
  c.nq = 16;
  c.nkv = 1;
  c.niq = 1;
  c.tokens = msa::test::size_for<std::int64_t>(4097, 131);
  c.kv = DType::nvfp4;
  c.scales = ScaleMode::per_tensor;
  c.index = DType::bf16;
  c.q = DType::bf16;
  c.iq = DType::bf16;
  c.seed = seed + 1;
  run_case(c);
  c.kv = DType::bf16;
  c.scales = ScaleMode::none;
  c.layout = Layout::nhd;
  c.index = DType::nvfp4;
  c.seed = seed + 2;
  run_case(c);
}

// A slot beyond the cache, an index slot beyond the index cache, a position
// outside the table: skipped (the CPU engine, unchecked, skips the same) and
// recorded in the DeviceCheck.
TEST(CudaPreAttention, BadSlotsAndPositionsAreSkippedAndRecorded) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(3403);
  MSA_TRACE_SEED(seed);
  for (int which = 0; which < 3; ++which) {
    Case c;
    c.tokens = 50;
    c.kv = which == 1 ? DType::nvfp4 : DType::fp8_e5m2;
    c.scales = which == 1 ? ScaleMode::per_tensor : ScaleMode::per_token_head;
    c.nq = 4;
    c.nkv = 2;
    c.niq = 2;
    c.seed = seed + std::uint64_t(which);
    Inputs in = msa::test::make_pre_attention_inputs(c);
    std::string want;
    if (which == 0) {
      in.slots[17] = in.pages * msa::kBlockSize + 5;
      want = msa::detail::concat("slots[17] = ", in.slots[17], " beyond the cache (", in.pages, " pages)");
    } else if (which == 1) {
      in.index_slots[23] = in.index_pages * msa::kBlockSize;
      want = msa::detail::concat("index_slots[23] = ", in.index_slots[23], " beyond the index cache (",
                                 in.index_pages, " pages)");
    } else {
      in.positions[31] = in.max_position + 7;
      want = msa::detail::concat("positions[31] = ", in.positions[31],
                                 " is outside the cos_sin table (max_position = ", in.max_position, " rows)");
    }
    run_case(c, want, &in);
  }
}

// Zero tokens launch nothing; slots all negative write q and index q only.
TEST(CudaPreAttention, EmptyAndAllSkipped) {
  MSA_SKIP_WITHOUT_GPU();
  Case c;
  c.tokens = 7;
  Inputs in = msa::test::make_pre_attention_inputs(c);
  DeviceCall dev(in);
  dev.args.num_tokens = 0;
  dev.run({});
  EXPECT_TRUE(dev.q.download() == in.q && dev.cache.download() == in.cache);
  for (auto& x : in.slots) x = -1;
  for (auto& x : in.index_slots) x = -3;
  run_case(c, "", &in);
}

// Bad arguments are refused on the host, before anything runs.
TEST(CudaPreAttention, BadArgumentsThrow) {
  MSA_SKIP_WITHOUT_GPU();
  Case c;
  c.tokens = 3;
  Inputs in = msa::test::make_pre_attention_inputs(c);
  DeviceCall dev(in);
  msa::PreAttentionArgs a = dev.args;
  a.num_kv_heads = 3;
  try {
    msa::cuda::pre_attention(dev.view, dev.index_view, a, nullptr);
    ADD_FAILURE() << "no msa::Error";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_kv_heads = 3"), std::string::npos) << e.what();
  }
  a = dev.args;
  a.index_q_dtype = DType::fp8_e4m3;  // with a bf16 index cache
  try {
    msa::cuda::pre_attention(dev.view, dev.index_view, a, nullptr);
    ADD_FAILURE() << "no msa::Error";
  } catch (const msa::Error& e) {
    EXPECT_NE(std::string(e.what()).find("index_q_dtype"), std::string::npos) << e.what();
  }
  msa::test::device_sync();
  EXPECT_TRUE(dev.q.download() == in.q && dev.cache.download() == in.cache);
}

// The call allocates nothing and never synchronizes: captured in a CUDA
// graph, a replay writes what a direct call writes.
TEST(CudaPreAttention, CapturedInCudaGraph) {
  MSA_SKIP_WITHOUT_GPU();
  const std::uint64_t seed = msa::test::seed_for(3404);
  MSA_TRACE_SEED(seed);
  Case c;
  c.tokens = 33;
  c.kv = DType::fp8_e4m3;
  c.scales = ScaleMode::per_token_head;
  c.q = DType::fp8_e4m3;
  c.seed = seed;
  Inputs in = msa::test::make_pre_attention_inputs(c);
  DeviceCall direct(in), graphed(in);
  direct.run({});

  msa::test::CheckBuffer check;
  cudaStream_t stream;
  MSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  MSA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  msa::cuda::reset_check(check.get(), stream);
  msa::cuda::pre_attention(graphed.view, graphed.index_view, graphed.args, stream, check.get());
  MSA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  MSA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  MSA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  MSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(direct.q.download() == graphed.q.download());
  EXPECT_TRUE(direct.iq.download() == graphed.iq.download());
  EXPECT_TRUE(direct.cache.download() == graphed.cache.download());
  EXPECT_TRUE(direct.index_cache.download() == graphed.index_cache.download());
  const auto a = direct.k_scales.download(), b = graphed.k_scales.download();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 4 * a.size()), 0) << "k_scales";
  EXPECT_EQ(check.message(), "");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

}  // namespace
