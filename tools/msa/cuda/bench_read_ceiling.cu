// The read ceiling's kernels (bench_read_ceiling.hpp). Two families:
//  - ld: every thread keeps U 16-byte loads in flight (a tile of
//    threads x U vectors, thread-contiguous per load, so a warp reads 512
//    contiguous bytes per instruction); persistent CTAs walk the tiles, or one
//    CTA per tile. The load is plain ld.global, ld.global.nc with
//    L1::no_allocate, or that with the L2::256B prefetch hint.
//  - bulk: one thread per CTA streams chunks into shared memory with
//    cp.async.bulk (the TMA engine) through a ring of mbarrier stages.
// Every thread XORs what it loaded; one word per CTA is written.
#include "bench_read_ceiling.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "bench_accounting.hpp"
#include "cuda/common/check.cuh"
#include "device_memory.hpp"
#include "fill.hpp"
#include "msa/error.hpp"
#include "timer.hpp"

namespace msa::tool {

namespace {

enum LoadKind : int { kPlain = 0, kNoAllocate = 1, kPrefetch256 = 2, kBulk = 3 };

template <int Kind>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  uint4 v;
  if constexpr (Kind == kPlain)
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else if constexpr (Kind == kNoAllocate)
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
  return v;
}

// XOR of every thread's acc, written to out[blockIdx.x]. Every thread calls it.
__device__ __forceinline__ void write_result(std::uint32_t acc, std::uint32_t* out) {
  __shared__ std::uint32_t warp_acc[32];
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xFFFFFFFFu, acc, o);
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint32_t r = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) r ^= warp_acc[w];
    out[blockIdx.x] = r;
  }
}

//   src: [n] 16-byte vectors; out: [gridDim.x]
template <int U, int Kind>
__global__ void read_kernel(const uint4* __restrict__ src, std::int64_t n, std::uint32_t* out) {
  const std::int64_t tile = std::int64_t(blockDim.x) * U;
  std::uint32_t acc = 0;
  for (std::int64_t base = std::int64_t(blockIdx.x) * tile; base < n; base += std::int64_t(gridDim.x) * tile) {
    uint4 v[U];
    const std::int64_t first = base + threadIdx.x;
    if (base + tile <= n) {
#pragma unroll
      for (int j = 0; j < U; ++j) v[j] = load16<Kind>(src + first + std::int64_t(j) * blockDim.x);
    } else {
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const std::int64_t i = first + std::int64_t(j) * blockDim.x;
        v[j] = i < n ? load16<Kind>(src + i) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int j = 0; j < U; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  write_result(acc, out);
}

constexpr int kMaxStages = 8;

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A chunk that has not landed after this long never will: the CTA stops and
// sets *stuck instead of hanging the run.
constexpr std::uint64_t kStuckNs = 200'000'000;

// Chunk k of this CTA is chunk blockIdx.x + k * gridDim.x of the buffer; stage
// k % stages holds it, its mbarrier completes in phase (k / stages) & 1.
//   src: [chunks * chunk_bytes] bytes; out: [gridDim.x]; stuck: [1]
__global__ void read_bulk_kernel(const unsigned char* __restrict__ src, std::int64_t chunks, int chunk_bytes,
                                 int stages, std::uint32_t* out, std::uint32_t* stuck) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) std::uint64_t full[kMaxStages];
  std::uint32_t acc = 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(&full[s])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    const std::int64_t mine =
        std::int64_t(blockIdx.x) < chunks ? (chunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    auto issue = [&](std::int64_t k) {
      const int s = int(k % stages);
      const std::uint32_t bar = smem_address(&full[s]);
      const std::uint32_t dst = smem_address(ring + std::int64_t(s) * chunk_bytes);
      const unsigned char* from = src + (std::int64_t(blockIdx.x) + k * gridDim.x) * chunk_bytes;
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(chunk_bytes) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                   "l"(from), "r"(chunk_bytes), "r"(bar)
                   : "memory");
    };
    for (std::int64_t k = 0; k < std::min<std::int64_t>(stages, mine); ++k) issue(k);
    for (std::int64_t k = 0; k < mine; ++k) {
      const int s = int(k % stages);
      const std::uint32_t bar = smem_address(&full[s]), phase = std::uint32_t((k / stages) & 1);
      std::uint32_t done = 0;
      const std::uint64_t start = global_ns();
      while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(phase)
            : "memory");
        if (!done && global_ns() - start > kStuckNs) break;
      }
      if (!done) {
        atomicExch(stuck, 1u);
        break;
      }
      acc ^= *reinterpret_cast<const std::uint32_t*>(ring + std::int64_t(s) * chunk_bytes);
      // The read above before the next bulk write into this stage.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      if (k + stages < mine) issue(k + stages);
    }
  }
  write_result(acc, out);
}

struct Variant {
  const char* name;
  int kind;         // LoadKind
  int unroll;       // ld: 16-byte loads per thread per tile
  int threads;      // ld: threads per CTA
  int ctas_per_sm;  // persistent grid = ctas_per_sm x SMs; 0: one CTA per tile (ld)
  int chunk_bytes;  // bulk
  int stages;       // bulk
};

constexpr Variant kVariants[] = {
    {"ld-u4-t256-c8", kPlain, 4, 256, 8, 0, 0},
    {"ld-u8-t256-c4", kPlain, 8, 256, 4, 0, 0},
    {"ld-u16-t256-c2", kPlain, 16, 256, 2, 0, 0},
    {"ld-u8-t512-c2", kPlain, 8, 512, 2, 0, 0},
    {"ld-u4-t1024-c2", kPlain, 4, 1024, 2, 0, 0},
    {"ld-u8-t1024-c1", kPlain, 8, 1024, 1, 0, 0},
    {"ld-u8-t256-all", kPlain, 8, 256, 0, 0, 0},
    {"nc-u8-t256-c4", kNoAllocate, 8, 256, 4, 0, 0},
    {"nc-u16-t256-c4", kNoAllocate, 16, 256, 4, 0, 0},
    {"nc-u4-t512-c4", kNoAllocate, 4, 512, 4, 0, 0},
    {"l2-u8-t256-c4", kPrefetch256, 8, 256, 4, 0, 0},
    {"l2-u4-t512-c4", kPrefetch256, 4, 512, 4, 0, 0},
    {"l2-u16-t128-c8", kPrefetch256, 16, 128, 8, 0, 0},
    {"bulk-32K-s6-c1", kBulk, 0, 32, 1, 32768, 6},
    {"bulk-16K-s6-c2", kBulk, 0, 32, 2, 16384, 6},
    {"bulk-64K-s3-c1", kBulk, 0, 32, 1, 65536, 3},
};

std::string about(const Variant& v) {
  const char* loads[] = {"ld.global", "ld.global.nc.L1::no_allocate", "ld.global.nc.L1::no_allocate.L2::256B"};
  std::string s;
  if (v.kind == kBulk) {
    s = "cp.async.bulk of " + std::to_string(v.chunk_bytes / 1024) + " KiB chunks into " + std::to_string(v.stages) +
        " shared-memory stages, one thread per CTA";
  } else {
    s = std::string(loads[v.kind]) + ".v4, " + std::to_string(v.unroll) + " loads in flight per thread, " +
        std::to_string(v.threads) + " threads per CTA";
  }
  return s + (v.ctas_per_sm > 0 ? ", " + std::to_string(v.ctas_per_sm) + " CTA(s) per SM" : ", one CTA per tile");
}

// The kernel of an ld variant.
template <int U>
const void* ld_kernel(int kind) {
  switch (kind) {
    case kPlain: return reinterpret_cast<const void*>(read_kernel<U, kPlain>);
    case kNoAllocate: return reinterpret_cast<const void*>(read_kernel<U, kNoAllocate>);
    default: return reinterpret_cast<const void*>(read_kernel<U, kPrefetch256>);
  }
}
const void* kernel_of(const Variant& v) {
  if (v.kind == kBulk) return reinterpret_cast<const void*>(read_bulk_kernel);
  return v.unroll == 4 ? ld_kernel<4>(v.kind) : v.unroll == 8 ? ld_kernel<8>(v.kind) : ld_kernel<16>(v.kind);
}

// The grid of a variant: ctas_per_sm x SMs, but no more CTAs per SM than fit
// at once (a persistent CTA that waits for a slot would run its share alone at
// the end); one CTA per tile for ld variants without a count.
int grid_of(const Variant& v, int sms, std::int64_t bytes) {
  if (v.ctas_per_sm == 0) {
    const std::int64_t tile = std::int64_t(v.threads) * v.unroll * 16;
    return int((bytes + tile - 1) / tile);
  }
  const int smem = v.kind == kBulk ? v.chunk_bytes * v.stages : 0;
  int resident = 0;
  MSA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel_of(v), v.threads, std::size_t(smem)));
  MSA_CHECK(resident > 0, "read ceiling: variant ", v.name, " does not fit on an SM");
  return std::min(v.ctas_per_sm, resident) * sms;
}

void launch(const Variant& v, int grid, const void* src, std::int64_t bytes, std::uint32_t* out, std::uint32_t* stuck,
            cudaStream_t s) {
  if (v.kind == kBulk) {
    read_bulk_kernel<<<grid, v.threads, v.chunk_bytes * v.stages, s>>>(
        static_cast<const unsigned char*>(src), bytes / v.chunk_bytes, v.chunk_bytes, v.stages, out, stuck);
  } else {
    const uint4* p = static_cast<const uint4*>(src);
    std::int64_t n = bytes / 16;
    void* args[] = {&p, &n, &out};
    MSA_CUDA_CHECK(cudaLaunchKernel(kernel_of(v), dim3(unsigned(grid)), dim3(unsigned(v.threads)), args, 0, s));
  }
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::vector<std::string> read_variant_names() {
  std::vector<std::string> names;
  for (const Variant& v : kVariants) names.emplace_back(v.name);
  return names;
}

std::vector<ReadVariantTime> measure_read_variants(std::int64_t bytes, int replays, const std::vector<std::string>& only,
                                                   cuda::Stream stream) {
  MSA_CHECK(bytes > 0 && bytes % (1 << 20) == 0, "read ceiling: bytes = ", bytes, " is not a positive multiple of 1 MiB");
  for (const std::string& name : only) {
    const auto names = read_variant_names();
    MSA_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "--read-variant = '", name,
              "' is not a variant of the read ceiling (msa bench --ceilings-only lists them)");
  }
  int device = 0, sms = 0;
  MSA_CUDA_CHECK(cudaGetDevice(&device));
  MSA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int bulk_smem = 0;  // the bulk kernel's dynamic shared memory: room for the largest ring
  for (const Variant& v : kVariants)
    if (v.kind == kBulk) bulk_smem = std::max(bulk_smem, v.chunk_bytes * v.stages);
  MSA_CUDA_CHECK(cudaFuncSetAttribute(read_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bulk_smem));
  std::vector<int> grids;
  std::int64_t most = 1;
  for (const Variant& v : kVariants) {
    grids.push_back(grid_of(v, sms, bytes));
    most = std::max<std::int64_t>(most, grids.back());
  }
  DeviceBuffer src{std::size_t(bytes)}, out(std::size_t(most) * sizeof(std::uint32_t)), stuck(sizeof(std::uint32_t));
  fill_random(src.get(), bytes / 4, DType::f32, 1.0f, 7, stream);
  const auto s = static_cast<cudaStream_t>(stream);
  std::vector<ReadVariantTime> times;
  for (std::size_t i = 0; i < std::size(kVariants); ++i) {
    const Variant& v = kVariants[i];
    if (!only.empty() && std::find(only.begin(), only.end(), v.name) == only.end()) continue;
    stuck.fill_bytes(0);
    auto run = [&](int) { launch(v, grids[i], src.get(), bytes, out.as<std::uint32_t>(), stuck.as<std::uint32_t>(), s); };
    const TimeStats t = summarize_ms(time_replays(run, 2, replays, stream));
    ReadVariantTime r;
    r.name = v.name;
    r.about = about(v);
    r.grid = grids[i];
    r.ms = t.median_us * 1e-3;
    r.gbps = double(bytes) / (r.ms * 1e-3) * 1e-9;
    if (to_host<std::uint32_t>(stuck, 1)[0] != 0) {
      // A chunk never landed: not a measurement of reading.
      r.about += " (FAILED: a chunk never landed; excluded)";
      r.gbps = 0.0;
    }
    times.push_back(r);
  }
  return times;
}

}  // namespace msa::tool
