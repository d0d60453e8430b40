// `msa bench-cp`: how one sparse layer step scales when a request's KV cache is
// sharded by blocks over 1..N GPUs (context parallelism, msa/cuda_cp.hpp). The
// options, the sweep over cases and rank counts, the table and the JSON report.
// How to read the output: bench/README.md, "Context parallelism".
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "bench_ceilings.hpp"
#include "bench_cp_case.hpp"
#include "bench_cp_ranks.hpp"
#include "commands.hpp"
#include "cuda/common/check.cuh"
#include "device_memory.hpp"
#include "msa/error.hpp"

namespace msa::tool {

namespace {

const char* const kAbout =
    "Times one sparse layer step (indexer + attention) with the request's KV cache sharded by blocks over 1..N GPUs "
    "(context parallelism over NCCL): a 1M-token decode and a 16K prefill chunk on a 256K context, MiniMax-M3 shapes "
    "16/1 and 64/4. Reports time, speed-up, scaling efficiency and the single-GPU baseline. See bench/README.md.";

// A merged result counts as right when its top-k equals the single GPU's and
// its output is within the contract's bound (relative Frobenius, bf16).
constexpr double kMaxRelErr = 1e-2;

struct CpOptions {
  bool quick = false;
  bool list = false;
  bool no_graph = false;
  std::vector<std::string> filters;
  int gpus = 0;             // 0: every visible GPU
  std::vector<int> ranks;   // empty: 1, 2, 4, ... up to gpus, and gpus
  std::string run_blocks = "0";
  std::string propose = "topk";
  std::string merge = "gather";
  int iters = 50;
  int warmup = 5;
  double budget_ms = 250.0;
  std::uint64_t seed = 1;
  int ceiling_replays = 10;
  std::string json;
};

// The rank counts to run: always 1 first (the reference), then the asked ones.
std::vector<int> rank_counts(const CpOptions& o, int gpus) {
  std::vector<int> n = {1};
  if (o.ranks.empty()) {
    for (int k = 2; k <= gpus; k *= 2) n.push_back(k);
    n.push_back(gpus);
  }
  n.insert(n.end(), o.ranks.begin(), o.ranks.end());
  std::sort(n.begin(), n.end());
  n.erase(std::unique(n.begin(), n.end()), n.end());
  return n;
}

// --run-blocks as CpSettings::run_blocks: "even" is -1; -2 when it is neither
// "even" nor a block count >= 0.
int parse_run_blocks(const std::string& s) {
  if (s == "even") return -1;
  std::size_t used = 0;
  int v = -2;
  try {
    v = std::stoi(s, &used);
  } catch (const std::exception&) {
    return -2;
  }
  return used == s.size() && v >= 0 ? v : -2;
}

std::string sharding_rule(int run_blocks) {
  if (run_blocks == 0) return "round-robin (block b on rank b % N)";
  if (run_blocks < 0) return "contiguous runs of ceil(blocks / N) blocks";
  return "contiguous runs of " + std::to_string(run_blocks) + " blocks";
}

bool run_is_right(const CpRun& r) {
  return r.topk_rows_differ <= 0 && (r.rel_err < 0 || r.rel_err <= kMaxRelErr);
}

// ---- derived numbers ---------------------------------------------------------------

struct Scaling {
  double speedup = NAN;     // T1 / TN, T1 the context-parallel step on one rank
  double efficiency = NAN;  // T1 / (N * TN)
  double vs_single = NAN;   // T_single / TN, T_single the single-GPU path (no CP)
};

Scaling scaling(const CpRun& r, double t1_us, double single_us) {
  Scaling s;
  const double tn = r.cp.step.median_us;
  if (tn <= 0.0) return s;
  if (t1_us > 0.0) {
    s.speedup = t1_us / tn;
    s.efficiency = s.speedup / r.ranks;
  }
  if (single_us > 0.0) s.vs_single = single_us / tn;
  return s;
}

double gbps(double bytes, const TimeStats& t) { return t.median_us > 0.0 ? bytes / (t.median_us * 1e3) : NAN; }

std::string check_words(const CpRun& r) {
  if (r.topk_rows_differ < 0) return "not compared";
  char buf[128];
  if (r.topk_rows_differ == 0)
    std::snprintf(buf, sizeof buf, "topk same, err %.1e", r.rel_err);
  else
    std::snprintf(buf, sizeof buf, "topk DIFFERS in %lld rows, err %.1e", static_cast<long long>(r.topk_rows_differ),
                  r.rel_err);
  return std::string(buf) + (run_is_right(r) ? "" : "  CHECK FAILED");
}

// ---- table -----------------------------------------------------------------------------

void print_case_header(const BenchCase& c) {
  std::printf("\n%s: %d requests x %d blocks, %lld tokens in the step, top-k %d\n", cp_case_name(c).c_str(),
              c.batch, cp_case_blocks(c), static_cast<long long>(c.num_tokens()), c.topk);
  std::printf("  %-6s %10s %10s %10s %8s %7s %8s %9s %6s  %s\n", "ranks", "step_us", "index_us", "attend_us",
              "speedup", "effic", "x_single", "idx_GB/s", "%copy", "check vs single GPU");
  std::fflush(stdout);
}

// A number in a printf format, or "-" when it is not finite (not measured).
std::string cell(const char* format, double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void print_times(const char* label, const CpTimes& t, const Scaling& s, double index_bytes, const Ceilings& ceil,
                 const std::string& check) {
  const double g = gbps(index_bytes, t.index);
  std::printf("  %-6s %10.1f %10.1f %10.1f %8s %7s %8s %9s %6s  %s\n", label, t.step.median_us, t.index.median_us,
              t.attend.median_us, cell("%.2f", s.speedup).c_str(), cell("%.0f%%", 100.0 * s.efficiency).c_str(),
              cell("%.2f", s.vs_single).c_str(), cell("%.0f", g).c_str(), cell("%.0f%%", 100.0 * g / ceil.copy_gbps).c_str(),
              check.c_str());
  std::fflush(stdout);
}

// ---- JSON ------------------------------------------------------------------------------

nlohmann::json stats_json(const TimeStats& t) {
  return {{"median", t.median_us}, {"min", t.min_us}, {"mean", t.mean_us}, {"p90", t.p90_us}, {"replays", t.samples}};
}

nlohmann::json times_json(const CpTimes& t) {
  return {{"step_us", stats_json(t.step)}, {"index_us", stats_json(t.index)}, {"attend_us", stats_json(t.attend)}};
}

nlohmann::json run_json(const CpRun& r, const Scaling& s, const Ceilings& ceil) {
  nlohmann::json j = {{"ranks", r.ranks},
                      {"sharding", {{"run_blocks", r.sharding.run_blocks}, {"rule", sharding_name(r.sharding)}}}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  j.update(times_json(r.cp));
  const double g = gbps(r.index_bytes, r.cp.index);
  j.update({{"speedup", s.speedup}, {"efficiency", s.efficiency}, {"vs_single", s.vs_single},
            {"index_bytes_per_rank", r.index_bytes}, {"index_gbps", g}, {"index_frac_copy", g / ceil.copy_gbps},
            {"candidate_bytes_per_rank", r.candidate_bytes}, {"partial_bytes_per_rank", r.partial_bytes},
            {"device_bytes_per_rank", r.device_bytes}, {"graph", r.graph},
            {"topk_rows_differ", r.topk_rows_differ}, {"rel_err", r.rel_err}, {"right", run_is_right(r)}});
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

nlohmann::json case_json(const BenchCase& c) {
  return {{"name", cp_case_name(c)}, {"mode", c.mode()},         {"num_q_heads", c.num_q_heads},
          {"num_kv_heads", c.num_kv_heads}, {"dtype", dtype_name(c.dtype)}, {"context", c.context},
          {"batch", c.batch},        {"query_len", c.query_len}, {"topk", c.topk},
          {"tokens", c.num_tokens()}, {"blocks_per_request", cp_case_blocks(c)}};
}

// ---- the sweep ---------------------------------------------------------------------------

// Communicators per rank count, made when first needed; an init failure is
// kept and reported for every case at that count.
struct CommCache {
  std::map<int, std::unique_ptr<CpComms>> comms;
  std::map<int, std::string> errors;
  const CpComms* get(int n, std::string& error) {
    if (!comms.count(n) && !errors.count(n)) {
      try {
        comms[n] = std::make_unique<CpComms>(n);
      } catch (const Error& e) {
        errors[n] = e.what();
      }
    }
    error = errors.count(n) ? errors[n] : "";
    return comms.count(n) ? comms[n].get() : nullptr;
  }
};

int run_bench_cp(const CpOptions& o) {
  std::vector<BenchCase> cases;
  for (const BenchCase& c : o.quick ? quick_cp_cases() : default_cp_cases())
    if (matches_any(c, o.filters)) cases.push_back(c);
  if (o.list) {
    for (const BenchCase& c : cases) std::printf("%s\n", cp_case_name(c).c_str());
    return kExitOk;
  }
  MSA_CHECK(!cases.empty(), "--case: no case matches (see msa bench-cp --list)");
  const int visible = cuda::device_count();
  if (visible == 0) {
    std::fprintf(stderr,
                 "msa bench-cp: no CUDA device is usable here (the CUDA runtime finds none); run it on a machine "
                 "with one or more H200s (sm_90a)\n");
    return kExitUsage;
  }
  if (o.gpus > visible) {
    std::fprintf(stderr, "msa bench-cp: --gpus %d but only %d GPU%s visible\n", o.gpus, visible,
                 visible == 1 ? " is" : "s are");
    return kExitUsage;
  }
  int gpus = o.gpus > 0 ? o.gpus : visible;
  std::string note;
  if (gpus > 1 && !have_nccl()) {
    note = "this build has no NCCL (no nccl.h / libnccl at configure time): N = 1 only";
    gpus = 1;
  } else if (gpus == 1) {
    note = visible == 1 ? "only 1 GPU is visible: N = 1 only; N > 1 needs more GPUs (one rank per GPU, over NCCL)"
                        : "--gpus 1: N = 1 only";
  }
  CpSettings s;
  s.iters = o.iters;
  s.warmup = o.warmup;
  s.budget_ms = o.budget_ms;
  s.seed = o.seed;
  s.graph = !o.no_graph;
  s.run_blocks = parse_run_blocks(o.run_blocks);
  s.propose_from_scores = o.propose == "scores";
  s.merge = o.merge == "reduce" ? cuda::cp::PartialMerge::reduce : cuda::cp::PartialMerge::gather;
  for (const int k : o.ranks) {
    if (k > gpus) {
      std::fprintf(stderr, "msa bench-cp: --ranks %d but %d GPU%s in use (%s)\n", k, gpus, gpus == 1 ? " is" : "s are",
                   note.empty() ? "see --gpus" : note.c_str());
      return kExitUsage;
    }
  }
  const std::vector<int> counts = rank_counts(o, gpus);

  const auto t0 = std::chrono::steady_clock::now();
  MSA_CUDA_CHECK(cudaSetDevice(0));
  const DeviceInfo dev = device_info();
  const std::string commit = shell_line("git describe --always --abbrev=40 --dirty 2>/dev/null");
  std::printf("msa bench-cp: %d x %s visible, %d in use; %d SMs, %.0f GB each; NCCL %s; commit %s\n", visible,
              dev.name.c_str(), gpus, dev.sm_count, double(dev.memory_bytes) / 1e9,
              have_nccl() ? nccl_version().c_str() : "absent", commit.empty() ? "unknown" : commit.c_str());
  if (!note.empty()) std::printf("note: %s\n", note.c_str());

  cudaStream_t stream = nullptr;
  MSA_CUDA_CHECK(cudaStreamCreate(&stream));
  const Ceilings ceil = measure_ceilings(stream, o.ceiling_replays);
  (void)cudaStreamDestroy(stream);
  std::string counts_words;
  for (const int n : counts) counts_words += (counts_words.empty() ? "" : ", ") + std::to_string(n);
  std::printf("ceilings on GPU 0: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s (msa bench's, median of %d)\n",
              ceil.copy_gbps, ceil.gemm_tflops, o.ceiling_replays);
  std::printf("ranks N = %s (GPU r is rank r, one host thread each, NCCL with NVLS off); sharding: %s; "
              "candidates: %s; partials: %s\n",
              counts_words.c_str(), sharding_rule(s.run_blocks).c_str(),
              s.propose_from_scores ? "a selection over each rank's block scores"
                                    : "each rank's own indexer top-k",
              o.merge == "reduce" ? "lse all-gather, weighted fp32 all-reduce"
                                  : "all-gather of outputs and lse");
  std::printf("timed: the layer step (cuda::index on the owned blocks + cp::run_layer) as a CUDA graph per rank, "
              "CUDA events on every rank, a replay's time = the slowest rank's, median of up to %d replays after %d "
              "warm-up; index / attend halves timed likewise\n",
              o.iters, o.warmup);

  CommCache comm_cache;
  nlohmann::json jcases = nlohmann::json::array();
  int errors = 0, wrong = 0;
  for (const BenchCase& c : cases) {
    print_case_header(c);
    nlohmann::json jc = case_json(c);
    nlohmann::json jruns = nlohmann::json::array();
    CpReference ref;
    double t1_us = 0.0, single_us = 0.0;
    for (const int n : counts) {
      std::string init_error;
      const CpComms* comms = comm_cache.get(n, init_error);
      CpRun r;
      r.ranks = n;
      r.sharding = cp_sharding(c, n, s.run_blocks);
      if (comms) r = run_cp_case(c, s, *comms, ref);
      else r.error = init_error;
      const std::string label = std::to_string(n);
      if (!r.error.empty()) {
        std::printf("  %-6s ERROR: %s\n", label.c_str(), r.error.c_str());
        std::fflush(stdout);
        ++errors;
        jruns.push_back(run_json(r, Scaling{}, ceil));
        continue;
      }
      if (r.has_single) {
        single_us = r.single.step.median_us;
        t1_us = r.cp.step.median_us;
        Scaling base;
        base.vs_single = 1.0;
        print_times("single", r.single, base, r.index_bytes, ceil, "reference (cuda::index + cuda::attend, no CP)");
        jc["single"] = times_json(r.single);
      }
      const Scaling sc = scaling(r, t1_us, single_us);
      print_times(label.c_str(), r.cp, sc, r.index_bytes, ceil, check_words(r));
      if (!r.note.empty()) std::printf("         (%s)\n", r.note.c_str());
      wrong += run_is_right(r) ? 0 : 1;
      jruns.push_back(run_json(r, sc, ceil));
    }
    if (t1_us > 0.0 && single_us > 0.0) {
      std::printf("  CP overhead at N = 1: %+.1f%% over the single-GPU path\n", 100.0 * (t1_us / single_us - 1.0));
      jc["cp_overhead_n1"] = t1_us / single_us - 1.0;
    }
    jc["runs"] = jruns;
    jcases.push_back(jc);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%zu cases in %.0f s, %d errors, %d wrong results\n", cases.size(), seconds, errors, wrong);

  if (!o.json.empty()) {
    nlohmann::json j = {
        {"command", "bench-cp"},
        {"commit", commit},
        {"gpus", {{"visible", visible}, {"used", gpus}, {"name", dev.name}, {"sm_count", dev.sm_count},
                  {"memory_bytes", dev.memory_bytes}, {"l2_bytes", dev.l2_bytes}}},
        {"nccl", {{"version", nccl_version()}, {"nvls", "off (NCCL_NVLS_ENABLE=0)"}}},
        {"ceilings", {{"gpu", 0}, {"copy_gbps", ceil.copy_gbps}, {"gemm_tflops", ceil.gemm_tflops},
                      {"replays", o.ceiling_replays}}},
        {"settings", {{"ranks", counts}, {"sharding", sharding_rule(s.run_blocks)}, {"propose", o.propose}, {"merge", o.merge}, {"iters", o.iters},
                      {"warmup", o.warmup}, {"budget_ms", o.budget_ms}, {"seed", o.seed}, {"graph", s.graph},
                      {"quick", o.quick}, {"filters", o.filters},
                      {"timing", "per replay the slowest rank's CUDA-event time; median over replays"}}},
        {"note", note}};
    j.update({{"seconds", seconds}, {"errors", errors}, {"wrong", wrong}, {"cases", jcases}});
    std::ofstream f(o.json);
    f << j.dump(2) << "\n";
    MSA_CHECK(f.good(), "--json: cannot write ", o.json);
  }
  return errors == 0 && wrong == 0 ? kExitOk : kExitFailed;
}

}  // namespace

Command register_bench_cp(CLI::App& app) {
  auto o = std::make_shared<CpOptions>();
  CLI::App* sub = app.add_subcommand("bench-cp", kAbout);
  sub->add_flag("--quick", o->quick, "one decode case and one prefill case");
  sub->add_flag("--list", o->list, "print the selected case names and exit");
  sub->add_option("--case", o->filters,
                  "run only cases whose name has every word of FILTER, e.g. \"decode 64/4 q=1\" (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--gpus", o->gpus, "GPUs to use, 0 = every visible one")->capture_default_str()->check(CLI::Range(0, 64));
  sub->add_option("--ranks", o->ranks, "rank counts to run, e.g. 1,2,8 (default 1, 2, 4, ... up to --gpus, and --gpus)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  sub->add_option("--run-blocks", o->run_blocks,
                  "sharding: 0 = round-robin, K = contiguous runs of K blocks, 'even' = runs of ceil(blocks / N)")
      ->capture_default_str()
      ->check([](const std::string& v) {
        return parse_run_blocks(v) >= -1 ? std::string() : "'" + v + "' is neither a block count >= 0 nor 'even'";
      });
  sub->add_option("--propose", o->propose,
                  "where a rank's candidates come from: topk = its indexer's own top-k, scores = a selection "
                  "over its block scores")
      ->capture_default_str()
      ->check(CLI::IsMember({"topk", "scores"}));
  sub->add_option("--merge", o->merge,
                  "how the ranks' partial results merge: gather = all-gather of outputs and lse, reduce = "
                  "all-gather of the lse and an fp32 all-reduce of the weighted outputs")
      ->capture_default_str()
      ->check(CLI::IsMember({"gather", "reduce"}));
  sub->add_flag("--no-graph", o->no_graph, "replay direct calls instead of CUDA graphs");
  sub->add_option("--iters", o->iters, "most timed replays per pass")->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--budget-ms", o->budget_ms, "fewer replays (at least 10) when a pass would take longer than this")
      ->capture_default_str();
  sub->add_option("--warmup", o->warmup, "untimed replays before each pass")->capture_default_str()->check(CLI::Range(0, 1000));
  sub->add_option("--ceiling-replays", o->ceiling_replays, "replays of the copy and GEMM ceilings")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--seed", o->seed, "seed of the caches and queries")->capture_default_str();
  sub->add_option("--json", o->json, "also write everything as JSON to FILE");
  return Command{sub, [o] { return run_bench_cp(*o); }};
}

}  // namespace msa::tool
