// Widening of a step's nvfp4 prefill keys into 16-bit blocks (widen_keys.hpp).
// Memory-bound: a CTA widens kBlocksPerCta blocks of one request, a block at a
// time.
#include <algorithm>
#include <cstdint>

#include "cuda/attention/shared/convert.cuh"
#include "cuda/common/check.cuh"
#include "cuda/indexer/widen_keys.hpp"
#include "msa/cache.hpp"
#include "msa/common.hpp"

namespace msa::cuda::indexer {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerCta = 4;
constexpr int kGroups = kHeadDim / 16;  // e4m3 group scales per key

struct WidenParams {
  StepView step;
  BlockTable table;
  const std::uint8_t* cache = nullptr;  // nvfp4 pages
  std::int64_t num_pages = 0;
  std::int64_t page_bytes = 0;
  std::uint8_t* widened = nullptr;
  std::int32_t block_limit = 0;
};

// Block b of prefill request r into its slot; thread i takes the (key, group)
// pairs i, i + kThreads, ...: key = pair / 8, so that a warp reads four keys'
// 288 contiguous bytes and writes their 1 KB of widened rows.
template <bool kF16>
__device__ __forceinline__ void widen_block(const WidenParams& p, std::int32_t r, std::int32_t b) {
  const std::int32_t page = p.table.at(r, b);
  if (page < 0 || page >= p.num_pages) return;
  const std::uint8_t* src = p.cache + page * p.page_bytes;
  std::uint8_t* dst = p.widened + widened_slot(p.step, p.block_limit, r, b) * kWidenedBlockBytes;
  // Every pair's loads before any store (the compiler cannot tell the two apart).
  constexpr int kPairs = kBlockSize * kGroups / kThreads;
  uint2 codes[kPairs];
  std::uint32_t sf[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = int(threadIdx.x) + j * kThreads, key = i / kGroups, group = i % kGroups;
    const std::uint8_t* row = src + key * index_nvfp4::kRowBytes;
    codes[j] = *reinterpret_cast<const uint2*>(row + 8 * group);
    sf[j] = row[index_nvfp4::kDataBytes + group];
  }
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int i = int(threadIdx.x) + j * kThreads, key = i / kGroups, group = i % kGroups;
    const std::uint32_t scale2 = attention::e4m3_scales_to_mma<kF16>(sf[j] | (sf[j] << 8));
    auto* out = reinterpret_cast<uint4*>(dst + key * (kHeadDim * 2) + 32 * group);
    out[0] = attention::fp4x8_to_mma<kF16>(codes[j].x, scale2);
    out[1] = attention::fp4x8_to_mma<kF16>(codes[j].y, scale2);
  }
}

// CTA (x, y): prefill request num_decodes + x, kBlocksPerCta blocks from
// kBlocksPerCta * y, then from every kBlocksPerCta * gridDim.y further.
template <bool kF16>
__global__ void __launch_bounds__(kThreads) widen_keys_kernel(const WidenParams p) {
  const std::int32_t r = p.step.num_decodes + std::int32_t(blockIdx.x);
  const std::int32_t seq = p.step.seq_lens[r];
  const std::int32_t blocks = seq <= 0 ? 0 : min((seq + kBlockSize - 1) / kBlockSize, p.block_limit);
  for (std::int32_t b0 = std::int32_t(blockIdx.y) * kBlocksPerCta; b0 < blocks;
       b0 += std::int32_t(gridDim.y) * kBlocksPerCta) {
    for (std::int32_t b = b0; b < min(b0 + kBlocksPerCta, blocks); ++b) widen_block<kF16>(p, r, b);
  }
}

}  // namespace

void launch_widen_keys(const StepView& step, const IndexerArgs& args, bool f16, void* widened,
                       std::int32_t block_limit, cudaStream_t stream) {
  const std::int32_t requests = step.num_requests - step.num_decodes;
  if (requests <= 0 || block_limit <= 0) return;
  WidenParams p;
  p.step = step;
  p.table = args.block_table;
  p.cache = static_cast<const std::uint8_t*>(args.cache.base);
  p.num_pages = args.cache.num_pages;
  p.page_bytes = args.cache.page_stride;  // bytes for nvfp4
  p.widened = static_cast<std::uint8_t*>(widened);
  p.block_limit = block_limit;
  const dim3 grid(unsigned(requests), unsigned(std::min((block_limit + kBlocksPerCta - 1) / kBlocksPerCta, 65535)));
  if (f16) widen_keys_kernel<true><<<grid, kThreads, 0, stream>>>(p);
  else widen_keys_kernel<false><<<grid, kThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace msa::cuda::indexer
