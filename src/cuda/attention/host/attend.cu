// Run step of the CUDA sparse attention: checks that the step and the
// arguments are those of the plan, fills the kernel parameters and runs the
// plan's schedule (msa/cuda_schedule.hpp) as it is: the row kernel for decode
// rows (and prefill rows that split), then the prefill rows' kernel family
// (token tiles on mma.sync or wgmma, blocks widened ahead, key-major with the
// device's choice), then the merges. Decides nothing; allocates nothing and
// never synchronizes the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/checks.hpp"
#include "cuda/attention/host/heuristics.hpp"
#include "cuda/attention/key_major/key_major.hpp"
#include "cuda/attention/host/kv_maps.hpp"
#include "cuda/attention/host/instances.hpp"
#include "cuda/attention/params.cuh"
#include "cuda/attention/host/plan_internal.hpp"
#include "cuda/attention/widen/widen.hpp"
#include "cuda/common/check.cuh"
#include "msa/cuda.hpp"
#include "msa/error.hpp"

namespace msa::cuda {
namespace attention {
namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

void check_cache(const KVCacheView& c) {
  MSA_CHECK(c.num_pages >= 0, "attend: cache.num_pages = ", c.num_pages, " is negative");
  if (c.num_pages == 0) return;  // nothing can be read: every page id is out of range
  MSA_CHECK(c.k != nullptr && (c.v != nullptr || c.dtype == DType::nvfp4),
            "attend: cache.k / cache.v is null");
  if (c.dtype == DType::nvfp4) {
    MSA_CHECK(aligned16(c.k), "attend: the nvfp4 cache base must be 16-byte aligned");
    MSA_CHECK(c.page_stride % 16 == 0 && c.page_stride >= 2 * c.num_kv_heads * nvfp4::kSlotBytes,
              "attend: nvfp4 cache.page_stride = ", c.page_stride,
              " bytes must be a multiple of 16 and at least ", 2 * c.num_kv_heads * nvfp4::kSlotBytes);
    return;
  }
  const auto eb = std::int64_t(dtype_bytes(c.dtype));
  MSA_CHECK(aligned16(c.k) && aligned16(c.v), "attend: cache.k and cache.v must be 16-byte aligned");
  MSA_CHECK((c.page_stride * eb) % 16 == 0, "attend: cache.page_stride = ", c.page_stride,
            " elements is not a multiple of 16 bytes");
  MSA_CHECK((c.head_stride * eb) % 16 == 0, "attend: cache.head_stride = ", c.head_stride,
            " elements is not a multiple of 16 bytes");
  MSA_CHECK((c.token_stride * eb) % 16 == 0, "attend: cache.token_stride = ", c.token_stride,
            " elements is not a multiple of 16 bytes");
  if (is_fp8(c.dtype) && c.scale_mode == ScaleMode::per_token_head)
    MSA_CHECK(c.k_scales != nullptr && c.v_scales != nullptr,
              "attend: per_token_head fp8 scales but cache.k_scales / cache.v_scales is null");
}

// The arguments' problem against the plan's, field by field.
void check_problem_matches(const AttentionProblem& plan, const AttentionArgs& args) {
  const AttentionProblem got = AttentionProblem::of(args);
  MSA_CHECK(got.num_q_heads == plan.num_q_heads, "attend: args.num_q_heads = ", got.num_q_heads,
            " but the plan has ", plan.num_q_heads);
  MSA_CHECK(got.num_kv_heads == plan.num_kv_heads, "attend: cache.num_kv_heads = ", got.num_kv_heads,
            " but the plan has ", plan.num_kv_heads);
  MSA_CHECK(got.topk == plan.topk, "attend: topk.topk = ", got.topk, " but the plan has ", plan.topk);
  MSA_CHECK(got.q_dtype == plan.q_dtype, "attend: q_dtype = ", dtype_name(got.q_dtype), " but the plan has ",
            dtype_name(plan.q_dtype));
  MSA_CHECK(got.out_dtype == plan.out_dtype, "attend: out_dtype = ", dtype_name(got.out_dtype),
            " but the plan has ", dtype_name(plan.out_dtype));
  MSA_CHECK(got.kv_dtype == plan.kv_dtype, "attend: cache dtype = ", dtype_name(got.kv_dtype),
            " but the plan has ", dtype_name(plan.kv_dtype));
  MSA_CHECK(got.kv_token_scales == plan.kv_token_scales, "attend: the cache's scales are ",
            got.kv_token_scales ? "per (token, head)" : "not per (token, head)", " but the plan's ",
            plan.kv_token_scales ? "are" : "are not");
}

void check_run(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args) {
  const AttentionSchedule& s = plan.schedule;
  check_problem_matches(s.problem, args);
  MSA_CHECK(s.num_tokens == step.num_tokens, "attend: the plan is for ", s.num_tokens, " tokens but the step has ",
            step.num_tokens);
  MSA_CHECK(s.num_decode_tokens == step.num_decode_tokens, "attend: the plan is for ", s.num_decode_tokens,
            " decode tokens but the step has ", step.num_decode_tokens);
  MSA_CHECK(s.tiles == 0 || s.num_requests == step.num_requests, "attend: the plan is for ", s.num_requests,
            " requests but the step has ", step.num_requests);
  MSA_CHECK(plan.workspace.bytes >= s.map.bytes && (s.map.bytes == 0 || plan.workspace.data != nullptr),
            "attend: the plan's workspace has ", plan.workspace.bytes, " bytes of the ", s.map.bytes, " needed");
  if (step.num_tokens == 0) return;
  MSA_CHECK(args.q != nullptr && args.out != nullptr, "attend: args.q / args.out is null");
  MSA_CHECK(aligned16(args.q) && aligned16(args.out), "attend: args.q and args.out must be 16-byte aligned");
  MSA_CHECK(args.topk.data != nullptr, "attend: args.topk.data is null");
  MSA_CHECK(args.block_table.data != nullptr || step.num_requests == 0,
            "attend: args.block_table.data is null");
  MSA_CHECK(std::isfinite(args.softmax_scale), "attend: softmax_scale = ", args.softmax_scale,
            " is not finite");
  MSA_CHECK(args.q_dtype != DType::fp8_e4m3 || std::isfinite(args.q_scale), "attend: q_scale = ",
            args.q_scale, " is not finite");
  check_cache(args.cache);
}

AttendParams make_params(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args,
                         const DeviceCheck& check) {
  const AttentionSchedule& s = plan.schedule;
  const KVCacheView& c = args.cache;
  auto* base = static_cast<unsigned char*>(plan.workspace.data);
  AttendParams p;
  p.q = args.q;
  p.q_kind = args.q_dtype == DType::fp16 ? kQueryFp16 : args.q_dtype == DType::fp8_e4m3 ? kQueryE4m3 : kQueryBf16;
  p.out = args.out;
  p.out_fp16 = args.out_dtype == DType::fp16;
  p.lse = args.lse;
  if (s.map.max_splits > 1) {
    p.partial_out = reinterpret_cast<float*>(base + s.map.partial_out);
    p.partial_lse = reinterpret_cast<float*>(base + s.map.partial_lse);
    p.counters = reinterpret_cast<int*>(base + s.map.counters);
  }
  p.max_splits = s.map.max_splits;
  p.num_q_heads = s.problem.num_q_heads;
  p.num_kv_heads = s.problem.num_kv_heads;
  p.group = p.num_q_heads / p.num_kv_heads;

  float k_scale = 1.0f, v_scale = 1.0f;
  const bool token_scales = is_fp8(c.dtype) && c.scale_mode == ScaleMode::per_token_head;
  if ((is_fp8(c.dtype) && !token_scales) || c.dtype == DType::nvfp4) {
    k_scale = c.k_scale;
    v_scale = c.v_scale;
  }
  const float q_scale = args.q_dtype == DType::fp8_e4m3 ? args.q_scale : 1.0f;
  p.score_scale_log2 = args.softmax_scale * 1.4426950408889634f * k_scale * q_scale;
  p.out_scale = v_scale;

  p.num_tokens = step.num_tokens;
  p.num_decode_tokens = step.num_decode_tokens;
  p.num_requests = step.num_requests;
  p.query_start = step.query_start;
  p.seq_lens = step.seq_lens;
  p.token_request = step.token_request;

  p.topk = args.topk;
  p.cache = c;
  // The kernels take non-null scale arrays for per-token fp8 scales.
  p.cache.k_scales = token_scales ? c.k_scales : nullptr;
  p.cache.v_scales = token_scales ? c.v_scales : nullptr;
  p.table = args.block_table;

  p.decode_splits = s.decode_splits;
  p.prefill_splits = s.prefill_splits;
  p.check = check.buffer;
  return p;
}

using F16 = std::true_type;
using Bf16 = std::false_type;
using Half = std::integral_constant<KvKind, KvKind::half>;
using E4m3 = std::integral_constant<KvKind, KvKind::e4m3>;
using E5m2 = std::integral_constant<KvKind, KvKind::e5m2>;
using Nvfp4 = std::integral_constant<KvKind, KvKind::nvfp4>;

// Calls fn(kind, fp16) with the instance of the cache dtype (the MMA type: the
// cache's for bf16 / fp16 caches, else fp16 when f16); throws for a dtype
// whose kernels this build left out (MSA_KV_DTYPES).
template <class Fn>
void dispatch(DType kv, bool f16, const char* what, Fn&& fn) {
  auto call = [&](auto kind, auto fp16) {
    if constexpr (kind_built(decltype(kind)::value))
      fn(kind, fp16);
    else
      fail(what, ": this build has no kernels for cache dtype ", dtype_name(kv), " (MSA_KV_DTYPES)");
  };
  switch (kv) {
    case DType::bf16: return call(Half{}, Bf16{});
    case DType::fp16: return call(Half{}, F16{});
    case DType::fp8_e4m3: return f16 ? call(E4m3{}, F16{}) : call(E4m3{}, Bf16{});
    case DType::fp8_e5m2: return f16 ? call(E5m2{}, F16{}) : call(E5m2{}, Bf16{});
    case DType::nvfp4: return f16 ? call(Nvfp4{}, F16{}) : call(Nvfp4{}, Bf16{});
    default: fail(what, ": cache dtype ", dtype_name(kv), " is not a KV cache dtype");
  }
}

// Whether the wgmma tiles over fp8 pages widened with per-token scales are built.
constexpr bool kScaledBuilt = kind_built(KvKind::e4m3) || kind_built(KvKind::e5m2);

// The row kernel (kTiles false) or the token-tile kernel.
template <bool kTiles>
void launch(const AttendParams& p, DType kv, bool f16, std::int64_t ctas, cudaStream_t s) {
  dispatch(kv, f16, "attend", [&](auto kind, auto fp16) {
    constexpr KvKind kKind = decltype(kind)::value;
    constexpr bool kF16 = decltype(fp16)::value;
    if constexpr (kTiles) launch_attend_tiles<kKind, kF16>(p, ctas, s);
    else if constexpr (row_instance_built(kKind, kF16)) launch_attend<kKind, kF16>(p, ctas, s);
    else fail("attend: no row kernel of cache dtype ", dtype_name(kv), " on bf16 MMA (row_f16 never picks it)");
  });
}

// The wgmma token tiles of the cache's kind.
void launch_wgmma_tiles(const AttendParams& p, const KvMaps& maps, DType kv, bool f16, cudaStream_t s) {
  dispatch(kv, f16, "attend", [&](auto kind, auto fp16) {
    launch_attend_wgmma_tiles<decltype(kind)::value, decltype(fp16)::value>(p, maps, s);
  });
}

}  // namespace

void prepare_kernels(const AttentionProblem& problem) {
  // The row kernel on fp16 MMA (row_f16 may pick it for any output), and
  // every kernel on the output's type.
  dispatch(problem.kv_dtype, true, "attention", [](auto kind, auto fp16) {
    if constexpr (row_instance_built(decltype(kind)::value, decltype(fp16)::value))
      prepare_attend<decltype(kind)::value, decltype(fp16)::value>();
  });
  dispatch(problem.kv_dtype, problem.out_dtype == DType::fp16, "attention", [&](auto kind, auto fp16) {
    constexpr KvKind kKind = decltype(kind)::value;
    constexpr bool kF16 = decltype(fp16)::value;
    if constexpr (row_instance_built(kKind, kF16)) prepare_attend<kKind, kF16>();
    prepare_attend_tiles<kKind, kF16>();
    prepare_attend_wgmma_tiles<kKind, kF16>();
    if constexpr (!kv_format(kKind).converted) {
      prepare_attend_key_major<kF16>();
    } else {
      // Over blocks widened ahead (widen.hpp): the tiles, and key-major.
      prepare_attend_wgmma_tiles<KvKind::half, kF16>();
      prepare_attend_key_major<kF16>();
      if constexpr (kv_format(kKind).fp8 && kScaledBuilt)
        if (problem.kv_token_scales) prepare_attend_wgmma_tiles<KvKind::half, kF16, true>();
    }
  });
}

ClusterCapacity cluster_capacity(const AttentionProblem& problem, bool one_cta_per_sm) {
  // Either built row-kernel instance may run (row_f16): the smaller capacity. At
  // one CTA per SM, the bf16 row kernel's (its shared memory holds one CTA
  // per SM) stands for a kernel that fits more.
  const DType kv =
      one_cta_per_sm && row_kernel_ctas_per_sm(problem.kv_dtype) > 1 ? DType::bf16 : problem.kv_dtype;
  ClusterCapacity c;
  for (const bool f16 : {true, problem.out_dtype == DType::fp16}) {
    dispatch(kv, f16, "attention", [&](auto kind, auto fp16) {
      constexpr KvKind kKind = decltype(kind)::value;
      constexpr bool kF16 = decltype(fp16)::value;
      if constexpr (row_instance_built(kKind, kF16)) {
        for (int size = 2; size <= kMaxClusterSplits; ++size) {
          const int n = row_cluster_capacity<kKind, kF16>(size);
          c.clusters[size] = f16 ? n : std::min(c.clusters[size], n);
        }
      }
    });
  }
  return c;
}

ClusterCapacity row_instance_capacity(const AttentionProblem& problem) {
  ClusterCapacity c;
  const bool f16 = row_f16(problem.kv_dtype, problem.out_dtype == DType::fp16, problem.kv_token_scales);
  dispatch(problem.kv_dtype, f16, "attention", [&](auto kind, auto fp16) {
    constexpr KvKind kKind = decltype(kind)::value;
    constexpr bool kF16 = decltype(fp16)::value;
    if constexpr (row_instance_built(kKind, kF16))
      for (int size = 2; size <= kMaxClusterSplits; ++size) c.clusters[size] = row_cluster_capacity<kKind, kF16>(size);
  });
  return c;
}

}  // namespace attention

void attend(const AttentionPlan& plan, const StepView& step, const AttentionArgs& args, Stream stream,
            const DeviceCheck& check) {
  using namespace attention;
  const AttentionSchedule& s = plan.schedule;
  check::step_shape(step);
  check_run(plan, step, args);
  check::attention_shape(step, args);
  if (step.num_tokens == 0) return;

  AttendParams p = make_params(plan, step, args, check);
  const DType kv = s.problem.kv_dtype;
  const bool f16 = s.problem.out_dtype == DType::fp16;  // the token tiles' MMA type (bf16 / fp16 caches: the cache's)
  const auto st = static_cast<cudaStream_t>(stream);
  auto* base = static_cast<unsigned char*>(plan.workspace.data);

  // The row kernel: one launch per class, so that each has its own cluster size.
  if (s.decode_ctas > 0) {
    AttendParams d = p;
    d.cluster_splits = s.decode_cluster;
    launch<false>(d, kv, s.row_f16, s.decode_ctas, st);
  }
  if (s.prefill_ctas > 0) {
    AttendParams r = p;
    r.cta_offset = s.decode_ctas;
    r.cluster_splits = s.prefill_cluster;
    launch<false>(r, kv, s.row_f16, s.prefill_ctas, st);
  }
  if (s.tiles == 0) return;

  // The token tiles.
  p.tile_tokens = s.tile_tokens;
  p.tile_count = s.tiles;
  if (s.prefill == PrefillKernel::mma_sync_tiles) {
    launch<true>(p, kv, f16, s.tiles, st);
    return;
  }
  const int group = p.group;
  KvMaps maps;
  // nvfp4 needs no K / V map: its producer bulk-copies the head-slot runs.
  // (The wgmma tiles load a bf16 / fp16 query's first tile through its map.)
  MSA_CHECK((kv == DType::nvfp4 || make_kv_maps(args.cache, maps)) &&
                make_query_map(args.q, args.q_dtype, step.num_tokens, p.num_q_heads, group, maps),
            "attend: the driver could not encode the TMA maps of the cache or the query");
  // Whole warpgroups of output rows go out by TMA where the output can be mapped.
  make_output_map(args.out, args.out_dtype, step.num_tokens, p.num_q_heads, group, maps);
  // Split tiles: tile_splits items per tile from tile_split_from on, then the merge.
  const bool split_tiles = s.tile_splits > 1;
  if (split_tiles) {
    p.tile_splits = s.tile_splits;
    p.tile_split_from = s.tile_split_from;
    p.tile_count = tile_split_items(s.tiles, TileSplit{s.tile_splits, s.tile_split_from});
    p.tile_partial_out = base + s.map.tile_partial_out;
    p.tile_partial_lse = reinterpret_cast<float*>(base + s.map.tile_partial_lse);
  }
  if (s.prefill == PrefillKernel::key_major) {
    // An fp8 / nvfp4 cache: every selected block widened ahead first, both
    // kernels then over those pages (per-tensor and global scales stay in the
    // score and output scales).
    AttendParams h = p;
    KvMaps half_maps = maps;
    if (s.widen_pages > 0) {
      const WidenArea widen = widen_area(s, base, step);
      MSA_CHECK(widened_maps(widen, half_maps), "attend: the driver could not encode the widened blocks' TMA maps");
      widen_ahead(p, widen, kv, st);
      h = widened_params(p, widen);
    }
    const DType pages = h.cache.dtype;  // bf16 / fp16: the MMA type
    // The k2q plan and the device's choice first; under that choice both
    // kernels launch, the one not chosen exiting at once.
    const KeyMajorBuffers km{s.map, base};
    prepare_key_major(km, s, step, args, h, s.key_major_always, st, check);
    if (!s.key_major_always) {
      h.tile_gate = km.tile_gate();
      launch_wgmma_tiles(h, half_maps, pages, pages == DType::fp16, st);
    }
    AttendParams k = h;
    k.tile_count = s.map.km_max_items;
    k.tile_gate = km.key_major_gate();
    k.km_items = km.items();
    k.km_tokens = km.tokens();
    k.km_slots = km.slots();
    k.km_partial_out = km.partial_out();
    k.km_partial_lse = km.partial_lse();
    make_partials_map(k.km_partial_out, args.out_dtype, std::int64_t(step.num_tokens) * p.topk.topk, p.num_q_heads,
                      group, half_maps);
    if (pages == DType::fp16) launch_attend_key_major<true>(k, half_maps, st);
    else launch_attend_key_major<false>(k, half_maps, st);
    combine_key_major(km, k, s.key_major_always, st);
    return;
  }
  if (s.prefill == PrefillKernel::widened_tiles) {
    // fp8 / nvfp4: the step's blocks widened ahead (widen.hpp), the tiles then
    // on the bf16 / fp16 kernel (per-token fp8 scales: with the pages'
    // scales); a gated step also launches the on-the-fly kernel, and the
    // device runs one of the two.
    const WidenArea widen = widen_area(s, base, step);
    KvMaps widen_maps = maps;  // the query and output maps carry over; widened_maps sets the KV maps
    MSA_CHECK(widened_maps(widen, widen_maps), "attend: the driver could not encode the widened blocks' TMA maps");
    widen_ahead(p, widen, kv, st);
    const AttendParams w = widened_params(p, widen);
    if (s.problem.kv_token_scales) {
      if constexpr (kScaledBuilt) {
        if (f16) launch_attend_wgmma_tiles<KvKind::half, true, true>(w, widen_maps, st);
        else launch_attend_wgmma_tiles<KvKind::half, false, true>(w, widen_maps, st);
      }
    } else {
      if (f16) launch_attend_wgmma_tiles<KvKind::half, true>(w, widen_maps, st);
      else launch_attend_wgmma_tiles<KvKind::half, false>(w, widen_maps, st);
    }
    if (s.widen_gated) {
      p.tile_gate = widen.gates() + 1;
      launch_wgmma_tiles(p, maps, kv, f16, st);
    }
  } else {
    launch_wgmma_tiles(p, maps, kv, f16, st);
  }
  if (split_tiles) combine_tile_splits(p, st);
}

}  // namespace msa::cuda
