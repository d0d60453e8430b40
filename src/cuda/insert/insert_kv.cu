// K/V insert into the paged main cache (contract 2 step 1, sections 3-4), bit-
// identical to cpu::insert_kv: the conversions are the MSA_HD ones of
// msa/numeric.hpp, run on the device.
//
// Work split: one warp per (token, KV head); lanes 0-15 take K, lanes 16-31 take
// V, each lane 8 consecutive elements (one 16-byte load of the bf16/fp16 source),
// stored by insert_store.cuh's store_kv_row (row reductions are shuffles inside
// the 16-lane half). Every store is vectorized when the address allows it.
#include <cstdint>

#include "core/checks.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device_check.cuh"
#include "cuda/insert/insert_store.cuh"
#include "cuda/insert/insert_util.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"
#include "msa/numeric.hpp"

namespace msa::cuda {
namespace {


struct InsertKVParams {
  KVCacheView cache;
  const std::uint16_t* k = nullptr;  // [num_tokens, num_kv_heads, 128] bf16/fp16 bits
  const std::uint16_t* v = nullptr;  // [num_tokens, num_kv_heads, 128] bf16/fp16 bits
  const std::int64_t* slots = nullptr;  // [num_tokens]
  std::int64_t num_tokens = 0;
  std::int64_t* check = nullptr;  // [8] DeviceCheck buffer or null
};

constexpr int kThreads = 256;

template <int Src, int Dst>
__global__ void __launch_bounds__(kThreads) insert_kv_kernel(const InsertKVParams p) {
  const std::int64_t gid = std::int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const std::int64_t pair = gid >> 5;  // (token, head), one per warp
  const int H = p.cache.num_kv_heads;
  if (pair >= p.num_tokens * H) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int is_v = lane >> 4;
  const int c = lane & 15;  // elements 8c .. 8c+7
  const std::int64_t i = pair / H;
  const std::int64_t h = pair - i * H;
  const std::int64_t slot = p.slots[i];
  if (slot < 0) return;  // padding
  if (slot >= p.cache.num_pages * kBlockSize) {
    if (h == 0 && lane == 0)
      detail::record_bad(p.check, detail::kBadSlot, i, 0, 0, slot, p.cache.num_pages);
    return;
  }
  const std::int64_t page = slot / kBlockSize;
  const std::int64_t token = slot - page * kBlockSize;

  float x[8];
  insert_detail::load8<Src>((is_v ? p.v : p.k) + pair * kHeadDim + 8 * c, x);

  insert_detail::store_kv_row<Dst>(p.cache, page, h, token, is_v, c, x, 0xffffffffu);
}

template <int Src>
void launch_kv(const InsertKVParams& p, int dst, cudaStream_t stream) {
  const std::int64_t threads = p.num_tokens * p.cache.num_kv_heads * 32;
  const dim3 grid(static_cast<unsigned>((threads + kThreads - 1) / kThreads));
  insert_detail::with_dst_tag(dst, [&](auto tag) {
    insert_kv_kernel<Src, decltype(tag)::value><<<grid, kThreads, 0, stream>>>(p);
  });
  MSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void insert_kv(const KVCacheView& cache, const InsertKVArgs& args, Stream stream,
               const DeviceCheck& check) {
  check::insert_kv_shape(cache, args);
  MSA_CHECK(args.src_dtype == DType::bf16 || args.src_dtype == DType::fp16,
            "insert_kv: src_dtype = ", dtype_name(args.src_dtype), " must be bf16 or fp16");
  const int dst = insert_detail::dst_tag(cache.dtype, "insert_kv: cache.dtype");
  MSA_CHECK(args.num_tokens >= 0, "insert_kv: num_tokens = ", args.num_tokens, " is negative");
  MSA_CHECK(cache.num_kv_heads >= 1, "insert_kv: cache.num_kv_heads = ", cache.num_kv_heads,
            " must be >= 1");
  if (args.num_tokens == 0) return;
  MSA_CHECK(args.k != nullptr && args.v != nullptr && args.slots != nullptr,
            "insert_kv: k, v and slots must not be null (", args.num_tokens, " tokens)");
  MSA_CHECK(cache.k != nullptr && cache.v != nullptr, "insert_kv: cache.k / cache.v is null");
  if (cache.scale_mode == ScaleMode::per_token_head && cache.dtype != DType::nvfp4) {
    MSA_CHECK(is_fp8(cache.dtype), "insert_kv: scale_mode per_token_head needs an fp8 cache, not ",
              dtype_name(cache.dtype));
    MSA_CHECK(cache.k_scales != nullptr && cache.v_scales != nullptr,
              "insert_kv: scale_mode per_token_head but cache.k_scales / v_scales is null");
  }
  const std::int64_t threads = args.num_tokens * cache.num_kv_heads * 32;
  MSA_CHECK((threads + kThreads - 1) / kThreads < (std::int64_t(1) << 31),
            "insert_kv: num_tokens = ", args.num_tokens, " is too large for one launch");

  InsertKVParams p;
  p.cache = cache;
  p.k = static_cast<const std::uint16_t*>(args.k);
  p.v = static_cast<const std::uint16_t*>(args.v);
  p.slots = args.slots;
  p.num_tokens = args.num_tokens;
  p.check = check.buffer;
  const auto s = static_cast<cudaStream_t>(stream);
  if (args.src_dtype == DType::bf16) launch_kv<insert_detail::kSrcBf16>(p, dst, s);
  else launch_kv<insert_detail::kSrcFp16>(p, dst, s);
}

}  // namespace msa::cuda
