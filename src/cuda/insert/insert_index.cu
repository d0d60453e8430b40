// Index-key insert (contract 4.2): one 128-vector per token into the index
// cache: bf16, a plain saturating fp8 e4m3 cast, or nvfp4 rows quantized like
// the nvfp4 KV cache. Bit-identical to cpu::insert_index. One thread per 8
// elements, a half-warp per token: an nvfp4 group is a lane pair, its amax one
// shuffle.
#include <cstdint>

#include "core/checks.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/insert/insert_store.cuh"
#include "cuda/insert/insert_util.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace {

struct InsertIndexParams {
  IndexCacheView cache;
  const std::uint16_t* src = nullptr;   // [num_tokens, 128] bf16/fp16 bits
  const std::int64_t* slots = nullptr;  // [num_tokens]
  std::int64_t num_tokens = 0;
  std::int64_t* check = nullptr;        // [8] DeviceCheck buffer or null
};

constexpr int kThreads = 256;

template <int Src, int Dst>
__global__ void __launch_bounds__(kThreads) insert_index_kernel(const InsertIndexParams p) {
  const std::int64_t gid = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const std::int64_t i = gid >> 4;  // token
  const int c = static_cast<int>(gid & 15);  // elements 8c .. 8c+7
  if (i >= p.num_tokens) return;
  const std::int64_t slot = p.slots[i];
  if (slot < 0) return;
  if (slot >= p.cache.num_pages * kBlockSize) {
    if (c == 0) detail::record_bad(p.check, detail::kBadSlot, i, 0, 0, slot, p.cache.num_pages);
    return;
  }
  float x[8];
  insert_detail::load8<Src>(p.src + i * kHeadDim + 8 * c, x);
  const std::int64_t page = slot / kBlockSize;
  const std::int64_t token = slot - page * kBlockSize;
  // The lanes of one token leave or stay together: its 16 lanes are all here.
  const unsigned row_lanes = 0xFFFFu << (threadIdx.x & 16u);
  insert_detail::store_index_row<Dst>(p.cache, page, token, c, x, row_lanes);
}

template <int Src>
void launch_index(const InsertIndexParams& p, DType dtype, cudaStream_t stream) {
  const std::int64_t threads = p.num_tokens * 16;
  const dim3 grid(static_cast<unsigned>((threads + kThreads - 1) / kThreads));
  if (dtype == DType::nvfp4) insert_index_kernel<Src, insert_detail::kDstNvfp4><<<grid, kThreads, 0, stream>>>(p);
  else if (dtype == DType::fp8_e4m3) insert_index_kernel<Src, insert_detail::kDstE4m3><<<grid, kThreads, 0, stream>>>(p);
  else insert_index_kernel<Src, insert_detail::kDstBf16><<<grid, kThreads, 0, stream>>>(p);
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void insert_index(const IndexCacheView& cache, const InsertIndexArgs& args, Stream stream,
                  const DeviceCheck& check) {
  check::insert_index_shape(cache, args);
  MSA_CHECK(args.src_dtype == DType::bf16 || args.src_dtype == DType::fp16,
            "insert_index: src_dtype = ", dtype_name(args.src_dtype), " must be bf16 or fp16");
  MSA_CHECK(cache.dtype == DType::bf16 || cache.dtype == DType::fp8_e4m3 || cache.dtype == DType::nvfp4,
            "insert_index: cache.dtype = ", dtype_name(cache.dtype), " must be bf16, fp8_e4m3 or nvfp4");
  MSA_CHECK(args.num_tokens >= 0, "insert_index: num_tokens = ", args.num_tokens, " is negative");
  if (args.num_tokens == 0) return;
  MSA_CHECK(args.index_k != nullptr && args.slots != nullptr && cache.base != nullptr,
            "insert_index: index_k, slots and cache.base must not be null (", args.num_tokens,
            " tokens)");
  MSA_CHECK((args.num_tokens * 16 + kThreads - 1) / kThreads < (std::int64_t(1) << 31),
            "insert_index: num_tokens = ", args.num_tokens, " is too large for one launch");
  InsertIndexParams p;
  p.cache = cache;
  p.src = static_cast<const std::uint16_t*>(args.index_k);
  p.slots = args.slots;
  p.num_tokens = args.num_tokens;
  p.check = check.buffer;
  const auto s = static_cast<cudaStream_t>(stream);
  if (args.src_dtype == DType::bf16) launch_index<insert_detail::kSrcBf16>(p, cache.dtype, s);
  else launch_index<insert_detail::kSrcFp16>(p, cache.dtype, s);
}

}  // namespace msa::cuda
