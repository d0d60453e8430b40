// `msa bench`: the options, the machine's ceilings, the sweep, the table and
// the JSON report. How to read the output: bench/README.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "bench_accounting.hpp"
#include "bench_case.hpp"
#include "bench_ceilings.hpp"
#include "commands.hpp"
#include "cuda/common/check.cuh"
#include "device_memory.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

namespace {

struct BenchOptions {
  std::string set = "default";  // bench_case_set
  bool quick = false;           // --quick: --set quick
  bool list = false;
  std::vector<std::string> filters;
  int iters = 100;
  int warmup = 5;
  double budget_ms = 250.0;
  int settle_ms = 1000;
  std::string pattern = "random";
  std::uint64_t seed = 1;
  int ceiling_replays = 20;
  std::string prefill = "query-major";  // --prefill: msa::cuda::PrefillOrder of the prefill steps
  int decode_splits = 0;                // --decode-splits: AttentionTuning::decode_splits (0: the plan's)
  int tile_splits = 0;                  // --tile-splits: AttentionTuning::tile_splits (0: the plan's)
  std::string kv_scales = "tensor";     // --kv-scales: fp8 scales per tensor or per (token, head)
  std::string tile_kernel = "auto";     // --tile-kernel: the token-tile kernel (auto: wgmma where it applies)
  std::int64_t widen_bytes = -1;        // --widen-bytes: AttentionTuning::widen_bytes (-1: the default limit)
  std::string json;
};

const char* kClockQuery =
    "nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu "
    "--format=csv,noheader 2>/dev/null";

nlohmann::json case_json(const BenchResult& r, const Ceilings& ceil) {
  const BenchCase& c = r.c;
  nlohmann::json j = {{"name", c.name()},
                      {"op", c.op == BenchOp::attend ? "attend" : "index"},
                      {"mode", c.mode()},
                      {"num_q_heads", c.num_q_heads},
                      {"num_kv_heads", c.num_kv_heads},
                      {"dtype", dtype_name(c.dtype)},
                      {"context", c.context},
                      {"batch", c.batch},
                      {"query_len", c.query_len},
                      {"topk", c.topk},
                      {"tokens", c.num_tokens()}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  const double s = r.time.median_us * 1e-6;
  const double tflops = r.traffic.flops / s * 1e-12, gbps = r.traffic.bytes / s * 1e-9;
  j["time_us"] = {{"median", r.time.median_us}, {"min", r.time.min_us}, {"mean", r.time.mean_us},
                  {"p90", r.time.p90_us}, {"replays", r.time.samples}};
  j["flops"] = r.traffic.flops;
  j["bytes"] = r.traffic.bytes;
  j[c.op == BenchOp::attend ? "attended_keys" : "scored_keys"] = r.traffic.keys;
  j["distinct_blocks"] = r.traffic.blocks;
  j["tflops"] = tflops;
  j["gbps"] = gbps;
  j["frac_gemm"] = tflops / ceil.gemm_tflops;
  j["frac_copy"] = gbps / ceil.copy_gbps;
  if (r.read_floor.samples > 0) {
    j["read_floor_us"] = {{"median", r.read_floor.median_us}, {"min", r.read_floor.min_us},
                          {"replays", r.read_floor.samples}};
    j["frac_read_floor"] = r.read_floor.median_us / r.time.median_us;
    j["read_floor_frac_copy"] = r.traffic.bytes / (r.read_floor.median_us * 1e-6) * 1e-9 / ceil.copy_gbps;
  }
  j["copies"] = r.copies;
  j["graph"] = r.graph;
  j["device_bytes"] = r.device_bytes;
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

void print_row(const BenchResult& r, const Ceilings& ceil) {
  if (!r.error.empty()) {
    std::printf("%-50s  ERROR: %s\n", r.c.name().c_str(), r.error.c_str());
    return;
  }
  const double s = r.time.median_us * 1e-6;
  const double tflops = r.traffic.flops / s * 1e-12, gbps = r.traffic.bytes / s * 1e-9;
  char floor[32] = "-";
  if (r.read_floor.samples > 0) std::snprintf(floor, sizeof floor, "%.1f", r.read_floor.median_us);
  std::printf("%-50s %10.1f %8.1f %6.1f%% %8.0f %6.1f%% %9s %6d%s\n", r.c.name().c_str(), r.time.median_us, tflops,
              100.0 * tflops / ceil.gemm_tflops, gbps, 100.0 * gbps / ceil.copy_gbps, floor, r.copies,
              r.graph ? "" : "  (no graph)");
  std::fflush(stdout);
}

int run_bench(const BenchOptions& o) {
  const std::string set = o.quick ? "quick" : o.set;

  std::vector<BenchCase> cases;
  for (const BenchCase& c : bench_case_set(set))
    if (matches_any(c, o.filters)) cases.push_back(c);
  if (o.list) {
    for (const BenchCase& c : cases) std::printf("%s\n", c.name().c_str());
    return kExitOk;
  }
  MSA_CHECK(!cases.empty(), "--case: no case matches (see msa bench --list)");
  if (cuda::device_count() == 0) {
    std::fprintf(stderr,
                 "msa bench: no CUDA device is usable here (the CUDA runtime finds none); run it on a "
                 "machine with an H200 (sm_90a)\n");
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const DeviceInfo dev = device_info();
  const std::string commit = shell_line("git rev-parse HEAD 2>/dev/null");
  const std::string clocks_start = shell_line(kClockQuery);
  BenchSettings s;
  s.iters = o.iters;
  s.warmup = o.warmup;
  s.budget_ms = o.budget_ms;
  s.pattern = o.pattern == "clustered" ? TopkPattern::clustered : TopkPattern::random;
  s.seed = o.seed;
  s.tuning.prefill_order = o.prefill == "key-major" ? cuda::PrefillOrder::key_major
                           : o.prefill == "auto"    ? cuda::PrefillOrder::automatic
                                                    : cuda::PrefillOrder::query_major;
  s.tuning.decode_splits = o.decode_splits;
  s.tuning.tile_splits = o.tile_splits;
  s.tuning.widen_bytes = o.widen_bytes;
  // The mma.sync token tiles instead of the wgmma ones (a comparison).
  s.tuning.tile_kernel = o.tile_kernel == "mma-sync" ? cuda::TileKernel::mma_sync : cuda::TileKernel::automatic;
  s.token_scales = o.kv_scales == "token";
  s.l2_bytes = double(dev.l2_bytes > 0 ? dev.l2_bytes : 50 << 20);
  s.memory_budget = std::min(40e9, 0.7 * double(dev.free_bytes));

  std::printf("msa bench: %s, %d SMs, L2 %.0f MB, %.0f GB; commit %s\n", dev.name.c_str(), dev.sm_count,
              s.l2_bytes / 1e6, double(dev.memory_bytes) / 1e9, commit.empty() ? "unknown" : commit.c_str());
  std::printf("clocks (sm, mem, max sm, max mem, power, temp): %s\n",
              clocks_start.empty() ? "nvidia-smi not available" : clocks_start.c_str());

  cudaStream_t stream = nullptr;
  // A blocking stream: it orders with the synchronous copies and memsets
  // (legacy default stream) that set up the inputs.
  MSA_CUDA_CHECK(cudaStreamCreate(&stream));
  const Ceilings ceil = measure_ceilings(stream, o.ceiling_replays);
  std::printf("ceilings: copy %.0f GB/s (cudaMemcpyAsync D2D of %.0f GiB, read + write, median of %d); "
              "bf16 GEMM %d^3 %.0f TFLOP/s (cuBLAS, fp32 accumulate, median of %d); launch floor %.2f us "
              "(a graph of one empty kernel, timed like the cases)\n",
              ceil.copy_gbps, double(ceil.copy_bytes) / double(1 << 30), o.ceiling_replays, ceil.gemm_n,
              ceil.gemm_tflops, o.ceiling_replays, ceil.launch_us);
  std::printf("timing: the attend / index run step captured in a CUDA graph per input copy; copies rotate so that "
              "consecutive replays touch different memory (>= 4x L2 together); median of up to %d replays after "
              "%d warm-up, each case after %d ms of idle; top-k pattern %s; case set %s\n\n",
              o.iters, o.warmup, o.settle_ms, o.pattern.c_str(), set.c_str());
  std::printf("read floor (decode / verify): the same graph timing of a kernel that only gathers the step's K / V "
              "blocks from the same pages into shared memory (one CTA per SM, three blocks in flight, no math)\n");
  std::printf("%-50s %10s %8s %7s %8s %7s %9s %6s\n", "case", "time_us", "TFLOP/s", "%gemm", "GB/s", "%copy",
              "floor_us", "copies");

  nlohmann::json jcases = nlohmann::json::array();
  int errors = 0;
  std::string fatal;
  for (const BenchCase& c : cases) {
    // Every case starts from an idle GPU: right after a heavy case (or the
    // GEMM ceiling) the clocks stay lowered for a while, and a short case
    // would run at them (measured on the H200: 64/4 b=1 q=256 45.3-46.3 us
    // right after the 16K-token chunk, 43.6-43.9 after a second of idle).
    if (o.settle_ms > 0) {
      MSA_CUDA_CHECK(cudaDeviceSynchronize());
      std::this_thread::sleep_for(std::chrono::milliseconds(o.settle_ms));
    }
    const BenchResult r = run_bench_case(c, s, stream);
    print_row(r, ceil);
    errors += r.error.empty() ? 0 : 1;
    jcases.push_back(case_json(r, ceil));
    const std::string e = device_error();
    if (!e.empty()) {
      fatal = "the device is in an error state after '" + c.name() + "' (" + e + "); the sweep stops";
      std::printf("FATAL %s\n", fatal.c_str());
      break;
    }
  }
  (void)cudaStreamDestroy(stream);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string clocks_end = shell_line(kClockQuery);
  std::printf("\n%zu cases in %.0f s, %d errors\n", jcases.size(), seconds, errors);

  if (!o.json.empty()) {
    nlohmann::json j = {
        {"command", "bench"},
        {"commit", commit},
        {"gpu",
         {{"name", dev.name},
          {"sm_count", dev.sm_count},
          {"compute_capability", std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor)},
          {"memory_bytes", dev.memory_bytes},
          {"l2_bytes", dev.l2_bytes},
          {"sm_clock_max_mhz", dev.sm_clock_max_mhz},
          {"mem_clock_max_mhz", dev.mem_clock_max_mhz},
          {"mem_bus_bits", dev.mem_bus_bits},
          {"clocks_start", clocks_start},
          {"clocks_end", clocks_end}}},
        {"ceilings",
         {{"copy_bytes", ceil.copy_bytes},
          {"copy_ms", ceil.copy_ms},
          {"copy_gbps", ceil.copy_gbps},
          {"gemm_n", ceil.gemm_n},
          {"gemm_ms", ceil.gemm_ms},
          {"gemm_tflops", ceil.gemm_tflops},
          {"launch_us", ceil.launch_us},
          {"replays", o.ceiling_replays}}},
        {"settings",
         {{"iters", o.iters},
          {"warmup", o.warmup},
          {"budget_ms", o.budget_ms},
          {"settle_ms", o.settle_ms},
          {"pattern", o.pattern},
          {"seed", o.seed},
          {"prefill", o.prefill},
          {"decode_splits", o.decode_splits},
          {"tile_splits", o.tile_splits},
          {"kv_scales", o.kv_scales},
          {"tile_kernel", o.tile_kernel},
          {"widen_bytes", o.widen_bytes},
          {"set", set},
          {"quick", set == "quick"},
          {"filters", o.filters},
          {"rotation", "input copies (own top-k, block tables and pages) spanning >= 4x L2; replay i uses copy i % copies"},
          {"flops", "4 * 128 * attended keys summed over (token, query head); index: 2 * 128 * scored keys over (token, KV head)"},
          {"bytes", "K+V (+scales) bytes of each distinct (request, KV head, block); index: index-cache blocks per request"},
          {"read_floor", "decode / verify: graph replays of a gather of the step's K / V blocks alone (same pages, one CTA per SM, three blocks in flight, no math), timed like the case"}}},
        {"seconds", seconds},
        {"errors", errors},
        {"fatal", fatal},
        {"cases", jcases}};
    std::ofstream f(o.json);
    MSA_CHECK(f.good(), "--json: cannot write ", o.json);
    f << j.dump(2) << "\n";
  }
  return errors == 0 && fatal.empty() ? kExitOk : kExitFailed;
}

}  // namespace

Command register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Times prefill, decode and verify attention (and the indexer) on MiniMax-M3 per-rank shapes, with the "
      "machine's copy-bandwidth and GEMM ceilings measured in the same run. See bench/README.md.");
  CLI::Option* set =
      sub->add_option("--set", o->set,
                      "case set: default (the full sweep), quick (about a dozen cases, well under two minutes) or "
                      "production (chunked prefill of 256, 1536 and 16384 tokens, batches 1-10, contexts 17K-170K)")
          ->capture_default_str()
          ->check(CLI::IsMember({"default", "quick", "production"}));
  sub->add_flag("--quick", o->quick, "the same as --set quick")->excludes(set);
  sub->add_option("--case", o->filters,
                  "run only cases whose name has every word of FILTER, e.g. \"decode 64/4 b=128\" (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_flag("--list", o->list, "print the selected case names and exit");
  sub->add_option("--iters", o->iters, "most timed replays per case")->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--warmup", o->warmup, "untimed replays before timing")->capture_default_str()->check(CLI::Range(0, 1000));
  sub->add_option("--budget-ms", o->budget_ms, "fewer replays (at least 10) for cases slower than this budget")
      ->capture_default_str();
  sub->add_option("--settle-ms", o->settle_ms,
                  "idle milliseconds before each case, so that every case starts at the clocks of an idle GPU")
      ->capture_default_str()
      ->check(CLI::Range(0, 60000));
  sub->add_option("--pattern", o->pattern, "top-k pattern: random or clustered")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "clustered"}));
  sub->add_option("--seed", o->seed, "seed of the synthetic top-k lists and data")->capture_default_str();
  sub->add_option("--ceiling-replays", o->ceiling_replays, "replays of the copy and GEMM ceilings")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--prefill", o->prefill,
                  "prefill order (msa::cuda::PrefillOrder): query-major (token tiles), key-major, or auto (steps of "
                  ">= 8192 tokens build the k2q plan and the device picks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"query-major", "key-major", "auto"}));
  sub->add_option("--decode-splits", o->decode_splits,
                  "split-K factor of decode / verify rows (msa::cuda::AttentionTuning::decode_splits); 0: the plan's")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  sub->add_option("--tile-splits", o->tile_splits,
                  "ways each prefill token tile is split (msa::cuda::AttentionTuning::tile_splits); 0: the plan's")
      ->capture_default_str()
      ->check(CLI::Range(0, 4));
  sub->add_option("--kv-scales", o->kv_scales, "fp8 caches: scales per tensor or per (token, head)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tensor", "token"}));
  sub->add_option("--tile-kernel", o->tile_kernel,
                  "prefill token tiles: auto (wgmma where the shape allows) or mma-sync (the older kernel, to compare)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "mma-sync"}));
  sub->add_option("--widen-bytes", o->widen_bytes,
                  "fp8 / nvfp4 prefill tiles: bytes of blocks widened ahead (msa::cuda::AttentionTuning::widen_bytes); "
                  "-1: the default limit, 0: widen on the fly")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(-1), std::int64_t(1) << 40));
  sub->add_option("--json", o->json, "also write everything as JSON to FILE");
  return Command{sub, [o] { return run_bench(*o); }};
}

}  // namespace msa::tool
