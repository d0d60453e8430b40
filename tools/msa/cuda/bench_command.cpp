// `msa bench`: the options, the machine's ceilings, the sweep, the table and
// the JSON report. How to read the output: bench/README.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "bench_accounting.hpp"
#include "bench_case.hpp"
#include "bench_ceilings.hpp"
#include "bench_choice.hpp"
#include "bench_sets.hpp"
#include "commands.hpp"
#include "cuda/common/check.cuh"
#include "device_memory.hpp"
#include "msa/cuda.hpp"

namespace msa::tool {

namespace {

struct BenchOptions {
  std::string set = "default";  // bench_case_set
  bool quick = false;           // --quick: the set's quick variant (default: --set quick)
  bool list = false;
  bool counts = false;  // --counts: with --list, each prefill case's choice counts (bench_choice.hpp)
  bool ceilings_only = false;   // measure and print the ceilings (every read variant), no cases
  std::vector<std::string> read_variants;  // --read-variant: time only these read-ceiling variants
  std::vector<std::string> filters;
  int iters = 100;
  int warmup = 5;
  double budget_ms = 250.0;
  int settle_ms = 1000;
  std::string pattern;  // --pattern: random or clustered for every case without its own; empty: case_pattern's default
  std::uint64_t seed = 1;
  int ceiling_replays = 20;
  std::string prefill = "query-major";  // --prefill: msa::cuda::PrefillOrder of the prefill steps
  std::int64_t key_major_min_tokens = cuda::AttentionTuning{}.key_major_min_tokens;  // --key-major-min-tokens
  int decode_splits = 0;                // --decode-splits: AttentionTuning::decode_splits (0: the plan's)
  int tile_splits = 0;                  // --tile-splits: AttentionTuning::tile_splits (0: the plan's)
  std::string kv_scales = "tensor";     // --kv-scales: fp8 scales per tensor or per (token, head)
  std::string tile_kernel = "auto";     // --tile-kernel: the token-tile kernel (auto: wgmma where it applies)
  std::int64_t widen_bytes = -1;        // --widen-bytes: AttentionTuning::widen_bytes (-1: the default limit)
  std::string index_widen_ahead = "on";  // --index-widen-ahead: BenchSettings::index_widen_ahead
  std::string json;
};

const char* kClockQuery =
    "nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu "
    "--format=csv,noheader 2>/dev/null";

// Rates of one timed step: TFLOP/s, GB/s and their fractions of the ceilings.
// frac_gemm: the time the FLOPs take at the GEMM ceiling of their MMA type
// (fp8 flops at the fp8 one, the rest at bf16's) over the step's time.
struct Rates {
  double tflops = 0.0, gbps = 0.0, frac_gemm = 0.0, frac_copy = 0.0, frac_read = 0.0;
};
Rates rates(const Traffic& t, const TimeStats& time, const Ceilings& ceil) {
  Rates r;
  if (time.median_us <= 0.0) return r;
  const double s = time.median_us * 1e-6;
  r.tflops = t.flops / s * 1e-12;
  r.gbps = t.bytes / s * 1e-9;
  if (ceil.gemm_tflops > 0.0 && ceil.gemm_fp8_tflops > 0.0) {
    const double at_ceiling = (t.flops - t.fp8_flops) / ceil.gemm_tflops + t.fp8_flops / ceil.gemm_fp8_tflops;
    r.frac_gemm = at_ceiling * 1e-12 / s;
  }
  r.frac_copy = ceil.copy_gbps > 0.0 ? r.gbps / ceil.copy_gbps : 0.0;
  r.frac_read = ceil.read_gbps > 0.0 ? r.gbps / ceil.read_gbps : 0.0;
  return r;
}

nlohmann::json time_json(const TimeStats& t) {
  return {{"median", t.median_us}, {"min", t.min_us}, {"mean", t.mean_us}, {"p90", t.p90_us}, {"replays", t.samples}};
}

nlohmann::json stage_json(const StageResult& st, double share, const char* keys_name, const Ceilings& ceil) {
  const Rates x = rates(st.traffic, st.time, ceil);
  return {{"time_us", time_json(st.time)}, {"share", share},        {"flops", st.traffic.flops},
          {"bytes", st.traffic.bytes},     {keys_name, st.traffic.keys}, {"distinct_blocks", st.traffic.blocks},
          {"tflops", x.tflops},            {"gbps", x.gbps},        {"frac_gemm", x.frac_gemm},
          {"frac_copy", x.frac_copy},      {"frac_read", x.frac_read}, {"graph", st.graph}};
}

std::vector<double> stage_times(const BenchResult& r) {
  std::vector<double> t;
  for (const StageResult& st : r.stages) t.push_back(st.time.median_us);
  return t;
}

nlohmann::json case_json(const BenchResult& r, const Ceilings& ceil, std::optional<TopkPattern> run_pattern) {
  const BenchCase& c = r.c;
  nlohmann::json j = {{"name", c.name()},
                      {"op", op_name(c.op)},
                      {"mode", c.mode()},
                      {"num_q_heads", c.num_q_heads},
                      {"num_kv_heads", c.num_kv_heads},
                      {"dtype", dtype_name(c.dtype)},
                      {"context", c.context},
                      {"batch", c.batch},
                      {"query_len", c.query_len},
                      {"topk", c.topk},
                      {"tokens", c.num_tokens()}};
  if (c.op == BenchOp::attend || c.op == BenchOp::layer) j["pattern"] = pattern_name(case_pattern(c, run_pattern));
  if (case_pattern(c, run_pattern) == TopkPattern::partial) j["shared"] = c.shared;
  if (c.op == BenchOp::index) j["iq_dtype"] = dtype_name(index_query_dtype(c.dtype));
  if (c.op == BenchOp::layer) {
    j["kv_dtype"] = dtype_name(c.dtype);
    j["index_dtype"] = dtype_name(c.index_dtype);
    j["iq_dtype"] = dtype_name(index_query_dtype(c.index_dtype));
  }
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  const Rates x = rates(r.traffic, r.time, ceil);
  j["time_us"] = time_json(r.time);
  j["flops"] = r.traffic.flops;
  if (r.traffic.fp8_flops > 0.0) j["fp8_flops"] = r.traffic.fp8_flops;
  j["bytes"] = r.traffic.bytes;
  if (c.op == BenchOp::attend || c.op == BenchOp::index) {
    j[c.op == BenchOp::attend ? "attended_keys" : "scored_keys"] = r.traffic.keys;
    j["distinct_blocks"] = r.traffic.blocks;
  }
  if (c.op == BenchOp::pre_attention) j["bytes_per_token"] = r.traffic.bytes / double(c.num_tokens());
  j["tflops"] = x.tflops;
  j["gbps"] = x.gbps;
  j["frac_gemm"] = x.frac_gemm;
  j["frac_copy"] = x.frac_copy;
  j["frac_read"] = x.frac_read;
  if (c.op == BenchOp::layer) {
    static constexpr const char* kKeys[kLayerStages] = {"inserted_tokens", "scored_keys", "attended_keys"};
    const std::vector<double> shares = stage_shares(stage_times(r));
    nlohmann::json stages;
    double sum = 0.0;
    for (int i = 0; i < kLayerStages; ++i) {
      stages[kLayerStageNames[i]] = stage_json(r.stages[std::size_t(i)], shares[std::size_t(i)], kKeys[i], ceil);
      sum += r.stages[std::size_t(i)].time.median_us;
    }
    j["stages"] = stages;
    j["stage_sum_us"] = sum;
    j["group_fraction"] = r.group_fraction;
  }
  if (r.read_floor.samples > 0) {
    j["read_floor_us"] = {{"median", r.read_floor.median_us}, {"min", r.read_floor.min_us},
                          {"replays", r.read_floor.samples}};
    j["frac_read_floor"] = r.read_floor.median_us / r.time.median_us;
    j["read_floor_frac_copy"] = r.traffic.bytes / (r.read_floor.median_us * 1e-6) * 1e-9 / ceil.copy_gbps;
  }
  if (r.copy_floor.samples > 0) {
    j["copy_floor_us"] = {{"median", r.copy_floor.median_us}, {"min", r.copy_floor.min_us},
                          {"replays", r.copy_floor.samples}};
    j["frac_copy_floor"] = r.copy_floor.median_us / r.time.median_us;
  }
  j["copies"] = r.copies;
  j["graph"] = r.graph;
  j["device_bytes"] = r.device_bytes;
  if (!r.note.empty()) j["note"] = r.note;
  return j;
}

constexpr int kNameWidth = 62;

void print_header() {
  std::printf("%-*s %10s %8s %7s %8s %7s %7s %6s %9s %6s\n", kNameWidth, "case", "time_us", "TFLOP/s", "%gemm",
              "GB/s", "%copy", "%read", "share", "floor_us", "copies");
}

// One table row: name, time, rates, share (or "-"), read or copy floor (or "-"), copies.
void print_line(const std::string& name, const TimeStats& time, const Traffic& traffic, const Ceilings& ceil,
                const char* share, const char* floor, const char* copies, bool graph) {
  const Rates x = rates(traffic, time, ceil);
  std::printf("%-*s %10.1f %8.1f %6.1f%% %8.0f %6.1f%% %6.1f%% %6s %9s %6s%s\n", kNameWidth, name.c_str(),
              time.median_us, x.tflops, 100.0 * x.frac_gemm, x.gbps, 100.0 * x.frac_copy, 100.0 * x.frac_read, share,
              floor, copies, graph ? "" : "  (no graph)");
}

void print_row(const BenchResult& r, const Ceilings& ceil) {
  if (!r.error.empty()) {
    std::printf("%-*s  ERROR: %s\n", kNameWidth, r.c.name().c_str(), r.error.c_str());
    std::fflush(stdout);
    return;
  }
  char floor[32] = "-", copies[16];
  if (r.read_floor.samples > 0) std::snprintf(floor, sizeof floor, "%.1f", r.read_floor.median_us);
  if (r.copy_floor.samples > 0) std::snprintf(floor, sizeof floor, "%.1f", r.copy_floor.median_us);
  std::snprintf(copies, sizeof copies, "%d", r.copies);
  print_line(r.c.name(), r.time, r.traffic, ceil, "-", floor, copies, r.graph);
  if (r.c.op == BenchOp::layer) {
    const std::vector<double> times = stage_times(r), shares = stage_shares(times);
    double sum = 0.0;
    for (int i = 0; i < kLayerStages; ++i) {
      char share[16];
      std::snprintf(share, sizeof share, "%.1f%%", 100.0 * shares[std::size_t(i)]);
      const StageResult& st = r.stages[std::size_t(i)];
      print_line(std::string("  ") + kLayerStageNames[i], st.time, st.traffic, ceil, share, "-", "", st.graph);
      sum += times[std::size_t(i)];
    }
    std::printf("  stages' sum %.1f us, step / sum %.3f", sum, sum > 0.0 ? r.time.median_us / sum : 0.0);
    if (r.group_fraction >= 0.0)
      std::printf("; %.1f%% of the selected blocks in the index queries' groups", 100.0 * r.group_fraction);
    std::printf("\n");
  }
  std::fflush(stdout);
}

nlohmann::json ceilings_json(const Ceilings& ceil, int replays) {
  nlohmann::json variants = nlohmann::json::array();
  for (const ReadVariantTime& v : ceil.read_variants)
    variants.push_back({{"name", v.name}, {"about", v.about}, {"grid", v.grid}, {"ms", v.ms}, {"gbps", v.gbps}});
  return {{"copy_bytes", ceil.copy_bytes},     {"copy_ms", ceil.copy_ms},         {"copy_gbps", ceil.copy_gbps},
          {"gemm_n", ceil.gemm_n},             {"gemm_ms", ceil.gemm_ms},         {"gemm_tflops", ceil.gemm_tflops},
          {"gemm_fp8_ms", ceil.gemm_fp8_ms},   {"gemm_fp8_tflops", ceil.gemm_fp8_tflops},
          {"launch_us", ceil.launch_us},       {"read_bytes", ceil.read_bytes},   {"read_ms", ceil.read_ms},
          {"read_gbps", ceil.read_gbps},       {"read_variant", ceil.read_variant}, {"read_variants", variants},
          {"replays", replays}};
}

void print_read_variants(const Ceilings& ceil) {
  std::printf("read ceiling variants (%.0f GiB read, median of the replays; the fastest is the ceiling):\n",
              double(ceil.read_bytes) / double(1 << 30));
  for (const ReadVariantTime& v : ceil.read_variants)
    std::printf("  %-16s %8.0f GB/s %6.1f%% of copy  %7d CTAs  %s%s\n", v.name.c_str(), v.gbps,
                ceil.copy_gbps > 0.0 ? 100.0 * v.gbps / ceil.copy_gbps : 0.0, v.grid, v.about.c_str(),
                v.name == ceil.read_variant ? "  <- ceiling" : "");
}

int run_bench(const BenchOptions& o) {
  const std::string set = o.quick && o.set == "default" ? "quick" : o.set;
  const std::optional<TopkPattern> run_pattern =
      o.pattern.empty() ? std::nullopt
                        : std::optional<TopkPattern>(o.pattern == "clustered" ? TopkPattern::clustered : TopkPattern::random);

  std::vector<BenchCase> cases;
  for (const BenchCase& c : bench_case_set(set, o.quick && set != "quick"))
    if (matches_any(c, o.filters)) cases.push_back(c);
  if (o.list) {
    for (const BenchCase& c : cases) {
      std::printf("%s", c.name().c_str());
      if (o.counts && c.op == BenchOp::attend && c.prefill) {
        const PrefillChoice k = prefill_choice(c, o.seed, run_pattern, o.key_major_min_tokens);
        std::printf("  tile_rounds=%lld items=%lld rounds/items=%.2f -> %s%s",
                    static_cast<long long>(k.tile_rounds), static_cast<long long>(k.items),
                    k.items > 0 ? double(k.tile_rounds) / double(k.items) : 0.0,
                    k.key_major ? "key-major" : "query-major", k.planned ? "" : " (auto: below key_major_min_tokens)");
      }
      std::printf("\n");
    }
    return kExitOk;
  }
  MSA_CHECK(!cases.empty() || o.ceilings_only, "--case: no case matches (see msa bench --list)");
  if (cuda::device_count() == 0) {
    std::fprintf(stderr,
                 "msa bench: no CUDA device is usable here (the CUDA runtime finds none); run it on a "
                 "machine with an H200 (sm_90a)\n");
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const DeviceInfo dev = device_info();
  const std::string commit = shell_line("git describe --always --abbrev=40 --dirty 2>/dev/null");
  const std::string clocks_start = shell_line(kClockQuery);
  BenchSettings s;
  s.iters = o.iters;
  s.warmup = o.warmup;
  s.budget_ms = o.budget_ms;
  s.pattern = run_pattern;
  s.seed = o.seed;
  s.tuning.prefill_order = o.prefill == "key-major" ? cuda::PrefillOrder::key_major
                           : o.prefill == "auto"    ? cuda::PrefillOrder::automatic
                                                    : cuda::PrefillOrder::query_major;
  s.tuning.key_major_min_tokens = o.key_major_min_tokens;
  s.tuning.decode_splits = o.decode_splits;
  s.tuning.tile_splits = o.tile_splits;
  s.tuning.widen_bytes = o.widen_bytes;
  // The mma.sync token tiles instead of the wgmma ones (a comparison).
  s.tuning.tile_kernel = o.tile_kernel == "mma-sync" ? cuda::TileKernel::mma_sync : cuda::TileKernel::automatic;
  s.token_scales = o.kv_scales == "token";
  s.index_widen_ahead = o.index_widen_ahead == "on";
  s.l2_bytes = double(dev.l2_bytes > 0 ? dev.l2_bytes : 50 << 20);
  s.memory_budget = std::min(40e9, 0.7 * double(dev.free_bytes));
  const std::string pattern_words = o.pattern.empty() ? "each case's (attend random, layer clustered)" : o.pattern;

  std::printf("msa bench: %s, %d SMs, L2 %.0f MB, %.0f GB; commit %s\n", dev.name.c_str(), dev.sm_count,
              s.l2_bytes / 1e6, double(dev.memory_bytes) / 1e9, commit.empty() ? "unknown" : commit.c_str());
  std::printf("clocks (sm, mem, max sm, max mem, power, temp): %s\n",
              clocks_start.empty() ? "nvidia-smi not available" : clocks_start.c_str());

  cudaStream_t stream = nullptr;
  // A blocking stream: it orders with the synchronous copies and memsets
  // (legacy default stream) that set up the inputs.
  MSA_CUDA_CHECK(cudaStreamCreate(&stream));
  const Ceilings ceil = measure_ceilings(stream, o.ceiling_replays, o.read_variants);
  std::printf("ceilings: copy %.0f GB/s (cudaMemcpyAsync D2D of %.0f GiB, read + write, median of %d); "
              "read %.0f GB/s (%.1f%% of copy: a kernel that only reads %.0f GiB, variant %s, the fastest of %zu); "
              "bf16 GEMM %d^3 %.0f TFLOP/s (cuBLAS, fp32 accumulate, median of %d), e4m3 GEMM %.0f TFLOP/s "
              "(cuBLASLt, the same n; %%gemm counts the fp8 index prefill's FLOPs against it); launch floor %.2f us "
              "(a graph of one empty kernel, timed like the cases)\n",
              ceil.copy_gbps, double(ceil.copy_bytes) / double(1 << 30), o.ceiling_replays, ceil.read_gbps,
              100.0 * ceil.read_gbps / ceil.copy_gbps, double(ceil.read_bytes) / double(1 << 30),
              ceil.read_variant.c_str(), ceil.read_variants.size(), ceil.gemm_n, ceil.gemm_tflops, o.ceiling_replays,
              ceil.gemm_fp8_tflops, ceil.launch_us);
  nlohmann::json jcases = nlohmann::json::array();
  int errors = 0;
  std::string fatal;
  if (o.ceilings_only) {
    print_read_variants(ceil);
  } else {
    std::printf("timing: the attend / index run step, or the layer step and each of its stages alone, captured in a "
                "CUDA graph per input copy; copies rotate so that consecutive replays touch different memory (>= 4x "
                "L2 together); median of up to %d replays after %d warm-up, each case after %d ms of idle; top-k "
                "pattern %s; case set %s%s\n\n",
                o.iters, o.warmup, o.settle_ms, pattern_words.c_str(), set.c_str(),
                o.quick && set != "quick" ? " (quick)" : "");
    std::printf("read floor (decode / verify): the same graph timing of a kernel that only gathers the step's K / V "
                "blocks from the same pages into shared memory (one CTA per SM, three blocks in flight, no math); "
                "%%read: GB/s over the read ceiling; share: a layer stage's time over the stages' sum\n");
    print_header();
  }

  for (const BenchCase& c : o.ceilings_only ? std::vector<BenchCase>{} : cases) {
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
    jcases.push_back(case_json(r, ceil, run_pattern));
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
        {"ceilings", ceilings_json(ceil, o.ceiling_replays)},
        {"settings",
         {{"iters", o.iters},
          {"warmup", o.warmup},
          {"budget_ms", o.budget_ms},
          {"settle_ms", o.settle_ms},
          {"pattern", o.pattern.empty() ? "per case" : o.pattern},
          {"seed", o.seed},
          {"prefill", o.prefill},
          {"key_major_min_tokens", o.key_major_min_tokens},
          {"decode_splits", o.decode_splits},
          {"tile_splits", o.tile_splits},
          {"kv_scales", o.kv_scales},
          {"tile_kernel", o.tile_kernel},
          {"widen_bytes", o.widen_bytes},
          {"index_widen_ahead", o.index_widen_ahead},
          {"set", set},
          {"quick", o.quick || set == "quick"},
          {"ceilings_only", o.ceilings_only},
          {"filters", o.filters},
          {"rotation", "input copies (own top-k, block tables and pages) spanning >= 4x L2; replay i uses copy i % copies"},
          {"flops", "4 * 128 * attended keys summed over (token, query head); index: 2 * 128 * scored keys over (token, KV head)"},
          {"bytes", "K+V (+scales) bytes of each distinct (request, KV head, block); index: index-cache blocks per request; "
                    "insert: new K, V, index keys (bf16) and slots read, cache rows written"},
          {"layer", "insert (insert_kv + insert_index) + index + attend over the indexer's top-k, one graph per copy; "
                    "each stage alone the same way; share = stage time / sum of the stages' times"},
          {"read_floor", "decode / verify: graph replays of a gather of the step's K / V blocks alone (same pages, one CTA per SM, three blocks in flight, no math), timed like the case"},
          {"copy_floor", "pre_attention: graph replays of a copy kernel on the SMs of half the step's bytes (reading and writing as many as the step moves) between as many rotated buffer pairs, timed like the case"}}},
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
      "Times prefill, decode and verify attention, the indexer, whole sparse-layer steps and pre-attention on "
      "MiniMax-M3 per-rank shapes, with the machine's copy-bandwidth, read-bandwidth and GEMM ceilings measured in the "
      "same run. See bench/README.md.");
  sub->add_option("--set", o->set,
                  "case set: default (the full sweep), quick (about a dozen cases, well under two minutes), "
                  "production (chunked prefill of 256, 1536 and 16384 tokens, batches 1-10, contexts 17K-170K), "
                  "index (the indexer over bf16, fp8 and nvfp4 index caches: decode / verify at 32K-128K, production "
                  "prefill), layer (insert + index + attend steps of one sparse layer), peers (the attention cases "
                  "compared with other implementations, fp8 e4m3, bf16 and nvfp4 KV), overlap (prefill from random "
                  "through partly shared to clustered selections, bf16 and fp8 e4m3 KV), pre_attention (the fused "
                  "norm, RoPE and insert step, 1 to 32K tokens, every KV dtype) or ranks (the TP2 32/2 and TP8 8/1 "
                  "per-rank shapes: attend, index and pre-attention)")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {"default", "quick", "production", "index", "layer", "peers", "overlap", "pre_attention", "ranks"}));
  sub->add_flag("--quick", o->quick, "the set's quick variant: --set quick for the default set, a short layer set");
  sub->add_option("--case", o->filters,
                  "run only cases whose name has every word of FILTER, e.g. \"decode 64/4 b=128\" (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  CLI::Option* list = sub->add_flag("--list", o->list, "print the selected case names and exit");
  sub->add_flag("--counts", o->counts,
                "with --list: each attend prefill case's token-tile rounds and key-major items on its first input "
                "copy, counted on the host as --prefill auto counts them on the device, and the order they pick")
      ->needs(list);
  sub->add_option("--iters", o->iters, "most timed replays per case")->capture_default_str()->check(CLI::Range(1, 100000));
  sub->add_option("--warmup", o->warmup, "untimed replays before timing")->capture_default_str()->check(CLI::Range(0, 1000));
  sub->add_option("--budget-ms", o->budget_ms, "fewer replays (at least 10) for cases slower than this budget")
      ->capture_default_str();
  sub->add_option("--settle-ms", o->settle_ms,
                  "idle milliseconds before each case, so that every case starts at the clocks of an idle GPU")
      ->capture_default_str()
      ->check(CLI::Range(0, 60000));
  sub->add_option("--pattern", o->pattern,
                  "top-k pattern of every case without its own: random or clustered (default: random for attend "
                  "cases, clustered for layer cases)")
      ->check(CLI::IsMember({"random", "clustered"}));
  sub->add_flag("--ceilings-only", o->ceilings_only,
                "measure and print the ceilings, every variant of the read ceiling included, and no case");
  sub->add_option("--read-variant", o->read_variants,
                  "time only this variant of the read ceiling (repeatable; --ceilings-only lists them)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--seed", o->seed, "seed of the synthetic top-k lists and data")->capture_default_str();
  sub->add_option("--ceiling-replays", o->ceiling_replays, "replays of the copy, GEMM and read ceilings")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--prefill", o->prefill,
                  "prefill order (msa::cuda::PrefillOrder): query-major (token tiles), key-major, or auto (steps of at "
                  "least --key-major-min-tokens tokens build the k2q plan and the device picks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"query-major", "key-major", "auto"}));
  sub->add_option("--key-major-min-tokens", o->key_major_min_tokens,
                  "--prefill auto: the fewest tokens a step needs to build the k2q plan and let the device pick "
                  "(msa::cuda::AttentionTuning::key_major_min_tokens); also what --counts assumes")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t(0), std::int64_t(1) << 40));
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
  sub->add_option("--index-widen-ahead", o->index_widen_ahead,
                  "nvfp4 index caches: on sizes the index workspace to widen the prefill keys once a step "
                  "(msa::cuda::index_workspace_bytes with the cache dtype), off for the block scores only (the keys "
                  "then widen in the score kernel)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--json", o->json, "also write everything as JSON to FILE");
  return Command{sub, [o] { return run_bench(*o); }};
}

}  // namespace msa::tool
