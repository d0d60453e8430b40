// Public entry points of the CUDA indexer: index() = block scores (scores.cu)
// then the top-k selection (select.cu); select_topk() = the selection alone.
// Host work is shape checks and launch geometry only: no allocation, no host
// synchronization, so a decode step can be captured in a CUDA graph.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/checks.hpp"
#include "cuda/common/check.cuh"
#include "cuda/common/device.hpp"
#include "cuda/indexer/decode_scores.hpp"
#include "cuda/indexer/index_map.hpp"
#include "cuda/indexer/indexer_kernels.cuh"
#include "cuda/indexer/prefill_scores.hpp"
#include "cuda/indexer/widen_keys.hpp"
#include "msa/common.hpp"
#include "msa/dtype.hpp"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace {

constexpr std::size_t kWorkspaceAlign = 256;

std::size_t scores_bytes(std::int64_t num_tokens, std::int64_t num_kv_heads, std::int64_t max_blocks) {
  const std::size_t b = std::size_t(num_tokens) * std::size_t(num_kv_heads) * std::size_t(max_blocks) *
                        sizeof(float);
  return (b + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Room for the nvfp4 keys of `prefills` prefill requests widened ahead.
std::size_t widened_bytes(std::int64_t prefills, std::int64_t max_blocks) {
  return std::size_t(prefills) * std::size_t(max_blocks) * std::size_t(indexer::kWidenedBlockBytes);
}

// Prefill rows a request must have on average for its nvfp4 keys to be widened
// once ahead. A block widened ahead costs five to six times what widening a
// page in one tile of the score kernel adds (bench/RESULTS.md), so it pays from
// about six tiles of 256 rows a request; eight keep clear of the break-even.
constexpr std::int64_t kWidenAheadRows = 2048;

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

void check_select_numbers(const TopkView& out, std::int32_t init_blocks, std::int32_t local_blocks,
                          std::int32_t max_blocks) {
  MSA_CHECK(out.topk >= 1 && out.topk <= kMaxTopk, "indexer: out.topk = ", out.topk,
            " is outside [1, ", kMaxTopk, "]");
  MSA_CHECK(init_blocks >= 0 && local_blocks >= 0, "indexer: init_blocks = ", init_blocks,
            ", local_blocks = ", local_blocks, " must not be negative");
  MSA_CHECK(std::int64_t(init_blocks) + local_blocks <= out.topk, "indexer: init_blocks + local_blocks = ",
            init_blocks, " + ", local_blocks, " exceeds out.topk = ", out.topk);
  MSA_CHECK(max_blocks >= 0, "indexer: max_blocks = ", max_blocks, " is negative");
}

}  // namespace

std::size_t index_workspace_bytes(std::int32_t num_tokens, std::int32_t num_kv_heads,
                                  std::int32_t max_blocks) {
  MSA_CHECK(num_tokens >= 0 && num_kv_heads >= 0 && max_blocks >= 0,
            "index_workspace_bytes: num_tokens = ", num_tokens, ", num_kv_heads = ", num_kv_heads,
            ", max_blocks = ", max_blocks, " must not be negative");
  return scores_bytes(num_tokens, num_kv_heads, max_blocks);
}

std::size_t index_workspace_bytes(std::int32_t num_tokens, std::int32_t num_kv_heads, std::int32_t max_blocks,
                                  DType cache_dtype, std::int32_t num_prefill_requests) {
  MSA_CHECK(num_prefill_requests >= 0, "index_workspace_bytes: num_prefill_requests = ", num_prefill_requests,
            " is negative");
  const std::size_t scores = index_workspace_bytes(num_tokens, num_kv_heads, max_blocks);
  if (cache_dtype != DType::nvfp4) return scores;
  return scores + widened_bytes(num_prefill_requests, max_blocks);
}

namespace {

using indexer::DecodeKeys;
using indexer::DecodeQuery;

DecodeKeys decode_keys(DType t) {
  return t == DType::bf16 ? DecodeKeys::bf16 : t == DType::fp8_e4m3 ? DecodeKeys::e4m3 : DecodeKeys::nvfp4;
}
DecodeQuery decode_query(DType t) {
  return t == DType::bf16 ? DecodeQuery::bf16 : t == DType::fp16 ? DecodeQuery::fp16 : DecodeQuery::e4m3;
}

// The step's decode rows in units of at most 32 rows of one request, as even as possible.
indexer::DecodeScoreLaunch decode_units(const StepView& step, std::int32_t heads, DecodeQuery query) {
  indexer::DecodeScoreLaunch l;
  const std::int32_t rows = step.decode_query_len * heads;
  if (step.num_decodes <= 0 || rows <= 0) return l;
  const std::int32_t kMax = indexer::DecodeScoreLaunch::max_unit_rows(query);
  l.units_per_request = (rows + kMax - 1) / kMax;
  l.unit_rows = (rows + l.units_per_request - 1) / l.units_per_request;
  l.num_units = step.num_decodes * l.units_per_request;
  return l;
}

// Mma.sync block scores of the prefill rows [row_begin, row_end) (scores.cu):
// the path of the pairs the wgmma kernel does not take.
void legacy_scores(const StepView& step, const IndexerArgs& args, float* scores, std::int32_t max_blocks,
                   std::int32_t block_limit, std::int64_t row_begin, std::int64_t row_end, std::int64_t* check,
                   cudaStream_t s) {
  MSA_CHECK(is_half(args.iq_dtype),
            "indexer: iq_dtype = ", dtype_name(args.iq_dtype), " with an index cache of ", dtype_name(args.cache.dtype),
            " needs the Hopper kernels, which cannot map this index cache (base or page_stride not 16-byte aligned?)");
  indexer::launch_block_scores(step, args, scores, max_blocks, block_limit, row_begin, row_end, check, s);
}

}  // namespace

void index(const StepView& step, const IndexerArgs& args, std::int32_t max_blocks, const Workspace& ws,
           Stream stream, const DeviceCheck& check) {
  void* const workspace = ws.data;
  const std::size_t workspace_bytes = ws.bytes;
  check::indexer_shape(step, args);
  check_select_numbers(args.out, args.init_blocks, args.local_blocks, max_blocks);
  const DType kd = args.cache.dtype, qd = args.iq_dtype;
  MSA_CHECK(kd == DType::bf16 || kd == DType::fp8_e4m3 || kd == DType::nvfp4, "indexer: cache.dtype = ",
            dtype_name(kd), " but the index cache must be bf16, fp8_e4m3 or nvfp4");
  MSA_CHECK(is_half(qd) || (qd == DType::fp8_e4m3 && kd == DType::fp8_e4m3), "indexer: iq_dtype = ",
            dtype_name(qd), " with an index cache of ", dtype_name(kd),
            " (the index query is bf16 or fp16, or fp8_e4m3 with an fp8_e4m3 cache)");
  if (step.num_tokens == 0) return;
  const std::int64_t H = args.num_kv_heads;
  const std::size_t need = scores_bytes(step.num_tokens, H, max_blocks);
  MSA_CHECK(workspace_bytes >= need, "indexer: workspace.bytes = ", workspace_bytes, " but ",
            step.num_tokens, " tokens x ", H, " KV heads x ", max_blocks, " blocks need ", need);
  MSA_CHECK(workspace != nullptr || need == 0, "indexer: workspace.data is null");
  MSA_CHECK(aligned(workspace, 16), "indexer: workspace.data is not 16-byte aligned");
  MSA_CHECK(aligned(args.index_q, 16), "indexer: index_q is not 16-byte aligned");
  const std::int64_t page_bytes =
      kd == DType::nvfp4 ? args.cache.page_stride : args.cache.page_stride * std::int64_t(dtype_bytes(kd));
  MSA_CHECK(aligned(args.cache.base, 16) && page_bytes % 16 == 0,
            "indexer: the index cache base and page_stride (", page_bytes, " bytes) must be 16-byte aligned");
  auto* scores = static_cast<float*>(workspace);  // [num_tokens, H, max_blocks]
  const std::int32_t block_limit = std::min(max_blocks, args.block_table.max_blocks);
  const auto s = static_cast<cudaStream_t>(stream);
  const int sms = device_sm_count();

  // Decode (and verify) rows: the persistent decode kernel, every request's
  // pages bulk-copied and read once for all its rows.
  const std::int64_t decode_rows = std::int64_t(step.num_decode_tokens) * H;
  if (decode_rows > 0 && block_limit > 0) {
    const indexer::DecodeScoreLaunch l = decode_units(step, args.num_kv_heads, decode_query(qd));
    const std::int64_t work = std::int64_t(l.num_units) * block_limit;
    indexer::launch_decode_scores(step, args, decode_keys(kd), decode_query(qd), scores, max_blocks, block_limit, l,
                                  int(std::min<std::int64_t>(sms, work)), check.buffer, s);
  }
  // The index cache's tensor map (bf16 / fp8), for the prefill kernel.
  CUtensorMap key_map{};
  const bool have_map = kd != DType::nvfp4 && indexer::make_index_map(args.cache, key_map);
  // Prefill rows: the wgmma kernel for bf16 queries on a bf16 cache, fp8
  // queries on an fp8 cache and bf16 / fp16 queries on an nvfp4 cache (its
  // pages widened in shared memory); the mma.sync tiles otherwise.
  const std::int64_t all_rows = std::int64_t(step.num_tokens) * H;
  if (all_rows > decode_rows && block_limit > 0) {
    CUtensorMap query_map{};
    const bool wgmma = (have_map && ((qd == DType::bf16 && kd == DType::bf16) ||
                                     (qd == DType::fp8_e4m3 && kd == DType::fp8_e4m3))) ||
                       (kd == DType::nvfp4 && is_half(qd));
    if (wgmma && indexer::make_rows_map(args.index_q, qd, all_rows, indexer::kPrefillTileRows, query_map)) {
      const std::int64_t prefill_rows = all_rows - decode_rows;
      const std::int32_t prefills = step.num_requests - step.num_decodes;
      const std::int64_t tiles = prefill_rows / indexer::kPrefillTileRows + prefills;
      using PK = indexer::PrefillKeys;
      PK keys = kd == DType::bf16       ? PK::bf16
                : kd == DType::fp8_e4m3 ? PK::e4m3
                : qd == DType::fp16     ? PK::nvfp4_fp16
                                        : PK::nvfp4_bf16;
      // nvfp4 keys widened once ahead where the workspace has room behind the
      // scores and the requests' chunks are long enough to pay for it.
      const std::size_t widened = widened_bytes(prefills, block_limit);
      const bool slots_fit = std::int64_t(prefills) * block_limit <= std::numeric_limits<std::int32_t>::max();
      if (kd == DType::nvfp4 && prefill_rows >= kWidenAheadRows * prefills && slots_fit &&
          workspace_bytes - need >= widened) {
        IndexCacheView w;
        w.dtype = qd;
        w.base = static_cast<std::uint8_t*>(workspace) + need;
        w.num_pages = std::int64_t(prefills) * block_limit;
        w.page_stride = std::int64_t(kBlockSize) * kHeadDim;
        if (indexer::make_index_map(w, key_map)) {
          indexer::launch_widen_keys(step, args, qd == DType::fp16, w.base, block_limit, s);
          keys = qd == DType::fp16 ? PK::widened_fp16 : PK::widened_bf16;
        }
      }
      indexer::launch_prefill_scores(step, args, keys, key_map, query_map, scores, max_blocks, block_limit,
                                     int(std::min<std::int64_t>(sms, tiles * block_limit)), check.buffer, s);
    } else {
      legacy_scores(step, args, scores, max_blocks, block_limit, decode_rows, all_rows, check.buffer, s);
    }
  }
  indexer::launch_select(step, scores, scores, max_blocks, block_limit, args.num_kv_heads, args.out,
                         args.init_blocks, args.local_blocks, s);
}

void select_topk(const StepView& step, const float* scores, std::int32_t max_blocks,
                 const IndexerArgs& args, Stream stream) {
  check::step_shape(step);
  check_select_numbers(args.out, args.init_blocks, args.local_blocks, max_blocks);
  MSA_CHECK(args.num_kv_heads >= 1, "select_topk: num_kv_heads = ", args.num_kv_heads,
            " but at least 1 is needed");
  if (step.num_tokens == 0) return;
  MSA_CHECK(scores != nullptr, "select_topk: scores is null");
  MSA_CHECK(args.out.data != nullptr, "select_topk: out.data is null");
  indexer::launch_select(step, scores, nullptr, max_blocks, max_blocks, args.num_kv_heads, args.out,
                         args.init_blocks, args.local_blocks, static_cast<cudaStream_t>(stream));
}

}  // namespace msa::cuda
