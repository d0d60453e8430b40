// `msa run`: one realistic engine step of one sparse layer, on the CPU engine.
//
// The default is a MiniMax-M3 TP4 rank (16 query heads, 1 KV head) serving a
// mixed step: 8 decode requests with one draft token each, at cached contexts
// spread over 8K..64K tokens, plus one chunked prefill of 1,536 new tokens on a
// 32K cached context. The step starts from the fused QKV projection output
// (qkv_step.hpp) and runs pre-attention (norm, RoPE, q out, K / V / index-key
// insert), index and attend (--input kv: insert from ready K / V instead);
// sampled rows are checked against the float64 oracle, and every token's
// pre-attention outputs too. Exit 0 only if the checks pass.
// What it cannot serve it refuses before allocating anything (exit 2): options
// out of range or that do not apply to the chosen dtypes, an output file it
// could not write, a step larger than the host's (or the device's) memory.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "command.hpp"
#include "cpu/parallel.hpp"
#include "index_agreement.hpp"
#include "msa/cpu.hpp"
#include "msa/error.hpp"
#include "option_checks.hpp"
#include "oracle_check.hpp"
#include "pre_attention_check.hpp"
#include "qkv_step.hpp"
#include "report.hpp"
#include "run_limits.hpp"
#include "step_stats.hpp"
#include "workload.hpp"
#if MSA_HAVE_CUDA
#include "cuda/run_cuda.hpp"
#endif
#if MSA_HAVE_CUDA
#include "msa/cuda.hpp"
#endif

namespace msa::tool {

namespace {

struct RunOptions {
  int tp = 4;
  int batch = 8;                  // decode requests
  int draft_tokens = 1;           // per decode request: query length 1 + draft_tokens
  int decode_context_min = 8192;  // cached context of the decodes, tokens
  int decode_context_max = 65536;
  int context = 32768;        // cached context of the prefill
  int prefill_tokens = 1536;  // new tokens of the prefill (0: no prefill)
  std::string kv_dtype = "bf16";
  std::string kv_scales = "tensor";
  std::string layout = "hnd";
  std::string q_dtype = "bf16";
  std::string index_dtype = "bf16";
  int topk = 16;
  std::uint64_t seed = 0;
  int threads = 0;
  std::string backend = "auto";  // auto: cuda when built with it and a device is visible
  std::string input = "qkv";     // qkv: pre-attention from the QKV projection; kv: insert alone
  int decode_rows = 32;   // oracle rows sampled among the decode tokens
  int prefill_rows = 24;  // oracle rows sampled among the prefill tokens
  std::string json;
  std::string host_memory;  // limit on host memory ("" = what the machine has available)
  bool quiet = false;
  // Options given on the command line (others hold their defaults).
  bool kv_scales_given = false;
  bool layout_given = false;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A CLI11 check that accepts what `parse` accepts and otherwise repeats the library's words.
template <typename Parse>
CLI::Validator library_check(const char* name, Parse parse) {
  return CLI::Validator(
      [parse](std::string& s) -> std::string {
        try {
          parse(s);
          return {};
        } catch (const msa::Error& e) {
          return e.what();
        }
      },
      name);
}

// Progress lines on stderr, so that long stages show signs of life.
struct Progress {
  bool quiet = false;
  Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  void say(const std::string& what) {
    last = Clock::now();
    if (!quiet) std::fprintf(stderr, "msa run: [%6.1f s] %s\n", seconds_since(start), what.c_str());
  }
  // At most one line every two seconds.
  void tick(const std::string& what) {
    if (seconds_since(last) >= 2.0) say(what);
  }
};

// Decode contexts spread over [min, max]: one uniform draw in each of `batch` equal strata.
std::vector<RequestShape> make_requests(const RunOptions& o) {
  std::vector<RequestShape> requests;
  std::mt19937_64 rng(o.seed ^ 0x5EEDull);
  const double span = double(o.decode_context_max - o.decode_context_min);
  for (int i = 0; i < o.batch; ++i) {
    const double u = double(rng() >> 11) * 0x1p-53;
    const int context = o.decode_context_min + int(span * (i + u) / o.batch);
    requests.push_back(RequestShape{1 + o.draft_tokens, context});
  }
  if (o.prefill_tokens > 0) requests.push_back(RequestShape{o.prefill_tokens, o.context});
  return requests;
}

WorkloadSpec make_spec(const RunOptions& o) {
  WorkloadSpec s;
  s.model = ModelConfig::minimax_m3(o.tp);
  s.model.topk = o.topk;
  s.kv_dtype = parse_dtype(o.kv_dtype, "--kv-dtype");
  s.fp8_scales = o.kv_scales == "token" ? ScaleMode::per_token_head : ScaleMode::per_tensor;
  s.layout = parse_layout(o.layout.c_str(), "--layout");
  s.q_dtype = parse_dtype(o.q_dtype, "--q-dtype");
  s.index_dtype = parse_dtype(o.index_dtype, "--index-dtype");
  // An fp8 index cache reads an fp8 index query (contract 3); a low-precision
  // index is compared with a bf16 index of the same keys.
  s.fp8_index_query = s.index_dtype == DType::fp8_e4m3;
  s.bf16_index_twin = s.index_dtype != DType::bf16;
  s.requests = make_requests(o);
  s.decode_threshold = 1 + o.draft_tokens;
  s.seed = o.seed;
  s.num_threads = o.threads;
  return s;
}

// Cross-option checks CLI11 cannot express; throws CLI::ValidationError (exit 2).
void check_options(const RunOptions& o) {
  const DType kv = parse_dtype(o.kv_dtype, "--kv-dtype");
  if (o.kv_scales_given && !is_fp8(kv)) {
    throw CLI::ValidationError("--kv-scales", o.kv_scales + " applies to fp8 caches only (--kv-dtype " + o.kv_dtype +
                                                   (kv == DType::nvfp4 ? " has group scales and one global scale)"
                                                                       : " has no scales)"));
  }
  if (o.layout_given && kv == DType::nvfp4) {
    throw CLI::ValidationError("--layout", o.layout + " does not apply to an nvfp4 cache (its pages have one "
                                                      "layout: head slots of K and V)");
  }
  if (!o.json.empty()) {
    const std::string why = unwritable_reason(o.json);
    if (!why.empty()) throw CLI::ValidationError("--json", o.json + " cannot be written: " + why);
  }
  if (o.decode_context_min > o.decode_context_max) {
    throw CLI::ValidationError("--decode-context-min", std::to_string(o.decode_context_min) +
                                                           " is above --decode-context-max " +
                                                           std::to_string(o.decode_context_max));
  }
  if (o.batch == 0 && o.prefill_tokens == 0) {
    throw CLI::ValidationError("--batch",
                               "0 decodes and --prefill-tokens 0: the step would be empty");
  }
  if (o.prefill_tokens > 0 && o.prefill_tokens <= 1 + o.draft_tokens) {
    throw CLI::ValidationError("--prefill-tokens", std::to_string(o.prefill_tokens) +
                                                       " must exceed the decode query length " +
                                                       std::to_string(1 + o.draft_tokens) +
                                                       " (1 + --draft-tokens)");
  }
}

// The backend `auto` stands for, or why `cuda` cannot run here (exit 2).
bool cuda_usable() {
#if MSA_HAVE_CUDA
  return msa::cuda::device_count() > 0;
#else
  return false;
#endif
}

int refuse_cuda() {
#if MSA_HAVE_CUDA
  std::fprintf(stderr, "msa run: --backend cuda: no CUDA device is visible on this machine\n");
#else
  std::fprintf(stderr,
               "msa run: --backend cuda: this msa was built without the CUDA backend "
               "(configured with MSA_CUDA=OFF, or no nvcc was found)\n");
#endif
  return kExitUsage;
}

std::string gflops(double flops, double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GFLOP/s", seconds > 0 ? flops / seconds * 1e-9 : 0.0);
  return buf;
}

// Whether the step fits the host's memory (and, on the GPU, the device's);
// otherwise says why on stderr and returns false (exit 2).
bool fits_memory(const RunOptions& o, const WorkloadSpec& spec, bool use_cuda) {
  const bool qkv = o.input == "qkv";
  const HostNeed need =
      host_need(spec, qkv, !use_cuda, cpu::resolve_threads(o.threads), o.decode_rows, o.prefill_rows);
  std::string source = "--host-memory";
  const double limit = o.host_memory.empty() ? double(host_memory_available(source)) : double(parse_bytes(o.host_memory));
  if (need.total() > limit && (limit > 0 || !o.host_memory.empty())) {
    std::fprintf(stderr,
                 "msa run: the step needs about %s of host memory (KV cache %s, index cache %s, step %s, qkv rows "
                 "%s, and the largest of its stages: setup %s, CPU engine %s, oracle checks %s) but the limit is %s "
                 "(%s); use a smaller --batch, --decode-context-max, --context or --prefill-tokens\n",
                 format_bytes(need.total()).c_str(), format_bytes(need.workload.kv_cache).c_str(),
                 format_bytes(need.workload.index_cache).c_str(), format_bytes(need.workload.step).c_str(),
                 format_bytes(need.qkv).c_str(), format_bytes(need.workload.scratch).c_str(),
                 format_bytes(need.engine).c_str(),
                 format_bytes(need.oracle).c_str(), format_bytes(limit).c_str(), source.c_str());
    return false;
  }
#if MSA_HAVE_CUDA
  if (use_cuda) {
    const double device = run_step_cuda_bytes(spec, qkv), free = device_free_bytes();
    if (device > free) {
      std::fprintf(stderr,
                   "msa run: the step needs about %s of device memory but the GPU has %s free; use a smaller "
                   "--batch, --decode-context-max, --context or --prefill-tokens, or --backend cpu\n",
                   format_bytes(device).c_str(), format_bytes(free).c_str());
      return false;
    }
  }
#endif
  return true;
}

int run(const RunOptions& o) {
  check_options(o);
  if (o.backend == "cuda" && !cuda_usable()) return refuse_cuda();
  const bool use_cuda = o.backend == "cuda" || (o.backend == "auto" && cuda_usable());
  const WorkloadSpec spec = make_spec(o);
  if (!fits_memory(o, spec, use_cuda)) return kExitUsage;
  const Clock::time_point start = Clock::now();
  Progress progress{o.quiet, start, start};

  RunReport report;
  report.tp = o.tp;
  report.backend = use_cuda ? "cuda" : "cpu";
  report.threads = cpu::resolve_threads(o.threads);
  report.draft_tokens = o.draft_tokens;

  progress.say("setup: synthesizing the caches and inserting the cached context");
  Clock::time_point t0 = Clock::now();
  Workload w(spec, [&](const char* what, std::int64_t done, std::int64_t total) {
    progress.tick(detail::concat("setup: ", what, " ", with_commas(done), " / ", with_commas(total),
                                 " tokens"));
  });
  report.workload = &w;
  std::int64_t cached = 0;
  for (std::int32_t c : w.meta().context_lens) cached += c;
  report.stages.push_back(
      {"setup", seconds_since(t0), with_commas(cached) + " cached tokens generated and inserted"});

  std::optional<QkvStep> qkv;
  if (o.input == "qkv") qkv = make_qkv_step(w);
  const StepView step = w.step();
  const cpu::Options cpu = w.cpu_options();
  double insert_s = 0.0, index_s = 0.0, attend_s = 0.0;
  if (use_cuda) {
#if MSA_HAVE_CUDA
    progress.say("cuda: insert, index and attend on the GPU");
    const CudaStageTimes t = run_step_cuda(w, qkv ? &*qkv : nullptr);
    report.backend = "cuda (" + t.device + "; stage times are CUDA events)";
    insert_s = t.insert_s;
    index_s = t.index_s;
    attend_s = t.attend_s;
#endif
  } else {
    t0 = Clock::now();
    if (qkv) {
      cpu::pre_attention(w.kv_view(), w.index_view(), qkv->args(w), cpu);
    } else {
      cpu::insert_kv(w.kv_view(), w.insert_kv_args(), cpu);
      cpu::insert_index(w.index_view(), w.insert_index_args(), cpu);
    }
    insert_s = seconds_since(t0);
    progress.say("index: scoring blocks and selecting the top-k");
    t0 = Clock::now();
    cpu::index(step, w.indexer_args(), cpu);
    index_s = seconds_since(t0);
    progress.say("attend: sparse attention over the selected blocks");
    t0 = Clock::now();
    cpu::attend(step, w.attention_args(), cpu);
    attend_s = seconds_since(t0);
    if (spec.bf16_index_twin) {
      progress.say("index: the bf16 index of the same keys, for the agreement (untimed)");
      if (qkv) cpu::pre_attention(w.kv_view(), w.twin_index_view(), qkv->twin_args(w), cpu);
      else cpu::insert_index(w.twin_index_view(), w.insert_index_args(), cpu);
      cpu::index(step, w.twin_indexer_args(), cpu);
    }
  }
  if (spec.bf16_index_twin) report.agreement = index_agreement(w.meta(), w.model(), w.topk, w.twin_topk);
  report.stages.push_back(
      {qkv ? "pre-attn" : "insert", insert_s,
       with_commas(w.num_tokens()) +
           (qkv ? " tokens: Q/K norm and RoPE, q and index q out, K, V and index key inserted"
                : " tokens: K, V and index key")});
  report.stats = step_stats(w);
  report.stages.push_back({"index", index_s,
                           format_count(double(report.stats.index_keys_scored)) +
                               " index keys scored, " +
                               gflops(report.stats.index_flops(), index_s)});
  report.stages.push_back({"attend", attend_s,
                           format_count(double(report.stats.keys_attended)) +
                               " keys attended (all query heads), " +
                               gflops(report.stats.attend_flops(), attend_s)});

  progress.say("check: float64 oracle on sampled rows");
  t0 = Clock::now();
  const auto rows = sample_rows(w.meta(), o.decode_rows, o.prefill_rows);
  // The CUDA kernels dequantize fp8 / nvfp4 values into their MMA dtype: the
  // contract's fp8-arithmetic bound applies to them.
  const bool low_precision_maths =
      use_cuda && (is_fp8(spec.kv_dtype) || spec.kv_dtype == DType::nvfp4 || is_fp8(spec.q_dtype));
  Tolerance tol = contract_tolerance(low_precision_maths);
  // The GPU scores an e4m3 index query on fp8 tensor cores, whose accumulation
  // keeps fewer bits than fp32 (scores within 4e-3 relative of the CPU's, the
  // GPU tests' bound): two blocks that close may trade places.
  if (use_cuda && spec.fp8_index_query) tol.index_gap_abs = tol.index_gap_rel = 8e-3;
  report.check = check_rows(w, rows, tol);
  if (qkv) report.pre_attention = check_pre_attention(w, *qkv);
  report.stages.push_back(
      {"check", seconds_since(t0),
       std::to_string(rows.size()) + " rows against float64 dense masked attention"});
  report.total_seconds = seconds_since(start);

  print_report(report, stdout);
  std::fflush(stdout);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << report_json(report).dump(2) << '\n';
    MSA_CHECK(f.good(), "--json ", o.json, ": cannot write the file");
  }
  return report.passed() ? kExitOk : kExitFailed;
}

}  // namespace

// The size of --host-memory, in CLI11's words.
CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          parse_bytes(s);
          return {};
        } catch (const msa::Error& e) {
          return e.what();
        }
      },
      "SIZE");
}

Command add_run_command(CLI::App& msa) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* app = msa.add_subcommand(
      "run",
      "Run one synthetic engine step (insert, index, attend) of a MiniMax-M3 sparse layer and "
      "check sampled rows against the float64 oracle");
  const auto kv_dtype = library_check("KV_DTYPE", [](const std::string& s) {
    const DType t = parse_dtype(s, "--kv-dtype");
    MSA_CHECK(t == DType::bf16 || t == DType::fp16 || is_fp8(t) || t == DType::nvfp4,
              "--kv-dtype = ", s,
              " is not a KV cache dtype (bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4)");
  });
  const auto q_dtype = library_check("Q_DTYPE", [](const std::string& s) {
    const DType t = parse_dtype(s, "--q-dtype");
    MSA_CHECK(is_half(t) || t == DType::fp8_e4m3, "--q-dtype = ", s,
              " is not a query dtype (bf16, fp16, fp8_e4m3)");
  });
  const auto index_dtype = library_check("INDEX_DTYPE", [](const std::string& s) {
    const DType t = parse_dtype(s, "--index-dtype");
    MSA_CHECK(t == DType::bf16 || t == DType::fp8_e4m3 || t == DType::nvfp4, "--index-dtype = ", s,
              " is not an index cache dtype (bf16, fp8_e4m3, nvfp4)");
  });
  const auto layout =
      library_check("LAYOUT", [](const std::string& s) { parse_layout(s.c_str(), "--layout"); });
  const auto tokens = integer_in(0, 1 << 24, "tokens, up to 16M");
  app->option_defaults()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);  // the last one wins

  app->add_option("--tp", o->tp, "tensor-parallel degree: per-rank heads of MiniMax-M3")
      ->check(integer_of({1, 2, 4, 8}, "tensor-parallel degrees of MiniMax-M3"))
      ->capture_default_str();
  app->add_option("--batch", o->batch, "decode requests")
      ->check(integer_in(0, 4096, "decode requests"))
      ->capture_default_str();
  app->add_option("--draft-tokens", o->draft_tokens,
                  "speculative draft tokens per decode (query length 1 + this)")
      ->check(integer_in(0, 15, "draft tokens: a decode's query length is at most 16"))
      ->capture_default_str();
  app->add_option("--decode-context-min", o->decode_context_min,
                  "shortest cached context of a decode, tokens")
      ->check(tokens)
      ->capture_default_str();
  app->add_option("--decode-context-max", o->decode_context_max,
                  "longest cached context of a decode, tokens")
      ->check(tokens)
      ->capture_default_str();
  app->add_option("--context", o->context, "cached context of the chunked prefill, tokens")
      ->check(tokens)
      ->capture_default_str();
  app->add_option("--prefill-tokens", o->prefill_tokens,
                  "new tokens of the chunked prefill (0: no prefill)")
      ->check(tokens)
      ->capture_default_str();
  app->add_option("--kv-dtype", o->kv_dtype,
                  "KV cache dtype: bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4")
      ->check(kv_dtype)
      ->capture_default_str();
  CLI::Option* kv_scales =
      app->add_option("--kv-scales", o->kv_scales,
                      "fp8 KV scales: tensor (one per K and V) or token (per token and head); fp8 caches only")
          ->check(CLI::IsMember({"tensor", "token"}))
          ->capture_default_str();
  CLI::Option* layout_option =
      app->add_option("--layout", o->layout, "KV page layout: hnd, nhd, split (not for nvfp4, which has its own)")
          ->check(layout)
          ->capture_default_str();
  app->add_option("--q-dtype", o->q_dtype, "query dtype: bf16, fp16, fp8_e4m3 (output bf16)")
      ->check(q_dtype)
      ->capture_default_str();
  app->add_option("--index-dtype", o->index_dtype,
                  "index cache dtype: bf16, fp8_e4m3 (the index query cast to e4m3 too) or nvfp4 "
                  "(global scale 1/256); fp8 and nvfp4 report their agreement with a bf16 index")
      ->check(index_dtype)
      ->capture_default_str();
  app->add_option("--topk", o->topk, "blocks selected per (token, KV head)")
      ->check(integer_in(1, kMaxTopk, "blocks per token and KV head"))
      ->capture_default_str();
  app->add_option("--seed", o->seed, "seed of every random input")->check(unsigned_64())->capture_default_str();
  app->add_option("--threads", o->threads, "CPU engine threads (0: one per hardware thread)")
      ->check(integer_in(0, cpu::kMaxThreads, "threads"))
      ->capture_default_str();
  app->add_option("--backend", o->backend,
                  "auto (cuda when built with it and a GPU is visible, else cpu), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app->add_option("--decode-rows", o->decode_rows, "decode tokens checked against the oracle")
      ->check(integer_in(0, 1 << 20, "rows"))
      ->capture_default_str();
  app->add_option("--prefill-rows", o->prefill_rows, "prefill tokens checked against the oracle")
      ->check(integer_in(0, 1 << 20, "rows"))
      ->capture_default_str();
  app->add_option("--input", o->input,
                  "what the step starts from: qkv (the fused QKV projection output, through pre-attention) or "
                  "kv (ready K, V, index keys and queries, through the insert)")
      ->check(CLI::IsMember({"qkv", "kv"}))
      ->capture_default_str();
  app->add_option("--json", o->json, "also write the report as JSON to this file");
  app->add_option("--host-memory", o->host_memory,
                  "host memory the step may use, e.g. 8G (default: what the machine has available)")
      ->check(byte_size());
  app->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  return Command{app, [o, kv_scales, layout_option] {
                   o->kv_scales_given = kv_scales->count() > 0;
                   o->layout_given = layout_option->count() > 0;
                   return run(*o);
                 }};
}

}  // namespace msa::tool
