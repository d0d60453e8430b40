// `msa check`: the options, the pass/fail table and the JSON report. The case
// list is check_cases.hpp, one case's work check_run.cpp.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "check_cases.hpp"
#include "check_run.hpp"
#include "commands.hpp"
#include "cuda/common/check.cuh"
#include "device_memory.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

namespace {

struct CheckOptions {
  std::uint64_t seed = 1;
  int cases = 40;
  bool quick = false;
  std::vector<int> only;  // case indices to run (all when empty)
  std::string json;
};

constexpr int kQuickCases = 14;

std::string format_error(const CheckRow& r) {
  char buf[32];
  if (std::isinf(r.error)) return "inf";
  if (std::isnan(r.error)) return "nan";
  if (r.bound == 0.0) std::snprintf(buf, sizeof(buf), "%.0f", r.error);
  else std::snprintf(buf, sizeof(buf), "%.3g", r.error);
  return buf;
}

std::string format_bound(double b) {
  char buf[32];
  if (b == 0.0) return "0";
  std::snprintf(buf, sizeof(buf), "%.0e", b);
  return buf;
}

nlohmann::json number_or_text(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

int run_check(const CheckOptions& o) {
  if (cuda::device_count() == 0) {
    std::fprintf(stderr,
                 "msa check: no CUDA device is usable here (the CUDA runtime finds none), so there is "
                 "nothing to check; run it on a machine with an H200 (sm_90a)\n");
    return kExitUsage;
  }
  const DeviceInfo dev = device_info();
  const int count = o.quick ? kQuickCases : o.cases;
  std::vector<CheckCase> cases = make_check_cases(o.seed, count, o.quick);
  if (!o.only.empty()) {
    std::vector<CheckCase> picked;
    for (const int i : o.only) {
      MSA_CHECK(i >= 0 && i < count, "--case ", i, " is not in [0, ", count, ") (use --cases to extend the list)");
      picked.push_back(cases[std::size_t(i)]);
    }
    cases = picked;
  }
  std::printf("msa check: %zu cases, seed %llu%s, on %s (%d SMs)\n", cases.size(),
              static_cast<unsigned long long>(o.seed), o.quick ? " (quick)" : "", dev.name.c_str(), dev.sm_count);
  std::printf("replay one case with: msa check --seed %llu%s --case N\n\n",
              static_cast<unsigned long long>(o.seed), o.quick ? " --quick" : (" --cases " + std::to_string(count)).c_str());
  std::printf("%-5s %-14s %10s %8s  %s\n", "case", "what", "error", "bound", "result");

  cudaStream_t stream = nullptr;
  // A blocking stream: it orders with the synchronous copies and memsets
  // (legacy default stream) that set up the inputs.
  MSA_CUDA_CHECK(cudaStreamCreate(&stream));
  nlohmann::json jcases = nlohmann::json::array();
  int checks = 0, failed = 0, failed_cases = 0;
  std::vector<std::string> failures;
  std::string fatal;
  for (const CheckCase& c : cases) {
    std::printf("%s\n", c.name().c_str());
    std::fflush(stdout);
    const CaseResult res = run_check_case(c, stream);
    bool case_ok = true;
    nlohmann::json jrows = nlohmann::json::array();
    const std::string id = "#" + std::to_string(c.index);
    for (const CheckRow& r : res.rows) {
      ++checks;
      if (!r.pass) {
        ++failed;
        case_ok = false;
        failures.push_back(id + " " + r.what + ": " + r.note);
      }
      std::printf("%-5s %-14s %10s %8s  %s\n", id.c_str(), r.what.c_str(), format_error(r).c_str(),
                  format_bound(r.bound).c_str(), r.pass ? "PASS" : "FAIL");
      jrows.push_back({{"what", r.what}, {"error", number_or_text(r.error)}, {"bound", r.bound},
                       {"pass", r.pass}, {"note", r.note}});
    }
    std::printf("%-5s %.2f s\n", id.c_str(), res.seconds);
    failed_cases += case_ok ? 0 : 1;
    jcases.push_back({{"index", c.index}, {"name", c.name()}, {"seed", c.seed}, {"seconds", res.seconds},
                      {"pass", case_ok}, {"rows", jrows}});
    if (!res.fatal.empty()) {
      fatal = "the device is in an error state after case " + id + " (" + res.fatal +
              "); the remaining cases cannot run";
      break;
    }
  }
  (void)cudaStreamDestroy(stream);

  std::printf("\n%d checks in %zu cases: %d failed (%d cases)\n", checks, jcases.size(), failed, failed_cases);
  for (const std::string& f : failures) std::printf("  FAIL %s\n", f.c_str());
  if (!fatal.empty()) std::printf("  FATAL %s\n", fatal.c_str());
  const bool pass = failed == 0 && fatal.empty() && jcases.size() == cases.size();
  std::printf("%s\n", pass ? "PASS" : "FAIL");

  if (!o.json.empty()) {
    nlohmann::json j = {{"command", "check"},
                        {"seed", o.seed},
                        {"quick", o.quick},
                        {"device", dev.name},
                        {"commit", shell_line("git describe --always --abbrev=40 --dirty 2>/dev/null")},
                        {"checks", checks},
                        {"failed", failed},
                        {"fatal", fatal},
                        {"pass", pass},
                        {"cases", jcases}};
    std::ofstream f(o.json);
    MSA_CHECK(f.good(), "--json: cannot write ", o.json);
    f << j.dump(2) << "\n";
  }
  return pass ? kExitOk : kExitFailed;
}

}  // namespace

Command register_check(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* sub = app.add_subcommand(
      "check",
      "Randomized differential test of the GPU against the CPU engine: insert (cache bytes identical), "
      "index (scores close, top-k identical), attend (out and lse close) and pre-attention (q and cache bytes "
      "identical) over KV dtypes, layouts, GQA groups, top-k, index caches (bf16, fp8 with a bf16 / fp16 or e4m3 "
      "index query, nvfp4) and batch shapes. Exit 0 only if every check passes; 2 without a CUDA device.");
  sub->add_option("--seed", o->seed, "seed of the case list and data")->capture_default_str();
  sub->add_option("--cases", o->cases, "number of cases")->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_flag("--quick", o->quick, "14 small cases covering every KV dtype and index cache dtype");
  sub->add_option("--case", o->only, "run only case N of the list (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--json", o->json, "also write the results as JSON to FILE");
  return Command{sub, [o] { return run_check(*o); }};
}

}  // namespace msa::tool
