#include "run_limits.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cpu/attention_blocks.hpp"
#include "msa/error.hpp"
#include "qkv_step.hpp"

namespace msa::tool {

namespace {

// The CPU engine's scratch (src/cpu): the indexer's scores and fp32 queries of
// one chunk of tokens (at most 2^22 scores) and a key block per thread; the
// attention's converted blocks (a few per thread, within 512 MiB) and query
// state per thread. The two stages run one after the other.
double engine_bytes(const WorkloadSpec& spec, double tokens, int threads) {
  const double H = spec.model.num_kv_heads, budget = double(1 << 22);
  const double index = budget * sizeof(float) + std::min(tokens * H, budget) * kHeadDim * sizeof(float) +
                       threads * double(kHeadDim * kBlockSize * sizeof(float));
  const double block = sizeof(cpu::attn::Block);
  const double capacity =
      std::max(8.0, std::min(std::floor((512.0 * 1024 * 1024) / block / threads), double(spec.model.topk * 3 / 2 + 1)));
  const double attend = threads * (capacity * block + 3.0 * kMaxGroup * kHeadDim * sizeof(float));
  return std::max(index, attend);
}

// The oracle check (oracle_check.cpp): every query and index query as double,
// then per request the dense K, V and index keys of one head as double, the
// mask and the expected rows of its sampled tokens.
double oracle_bytes(const WorkloadSpec& spec, double tokens, int decode_rows, int prefill_rows) {
  const double H = spec.model.num_kv_heads, QH = spec.model.num_q_heads, G = QH / H, D = kHeadDim;
  double longest = 0, prefills = 0;
  for (const RequestShape& r : spec.requests) {
    longest = std::max(longest, double(r.query_len) + r.context_len);
    prefills += r.query_len > spec.decode_threshold;
  }
  const double rows = std::min(tokens, double(decode_rows) + std::max(double(prefill_rows), 4 * prefills));
  return tokens * (QH + H) * D * sizeof(double) + 3 * longest * D * sizeof(double) + G * longest +
         2 * rows * QH * (D + 1) * sizeof(double);
}

}  // namespace

// The pre-attention check (pre_attention_check.cpp): the reference's rounded
// heads of every token as double, the compared q and K / V rows (vectors that
// may double while they grow), and a scratch cache of the step's tokens.
double pre_attention_check_bytes(const WorkloadSpec& spec, double tokens) {
  const double H = spec.model.num_kv_heads, QH = spec.model.num_q_heads, D = kHeadDim;
  return tokens * D * sizeof(double) * ((QH + 3 * H + 1) + 4 * QH + 8 * H) + tokens * H * D * 8;
}

HostNeed host_need(const WorkloadSpec& spec, bool qkv_input, bool cpu_engine, int threads, int decode_rows,
                   int prefill_rows) {
  HostNeed n;
  n.workload = workload_bytes(spec);
  double tokens = 0;
  for (const RequestShape& r : spec.requests) tokens += r.query_len;
  if (qkv_input) n.qkv = qkv_step_bytes(spec);
  if (cpu_engine) n.engine = engine_bytes(spec, tokens, std::max(threads, 1));
  n.oracle = std::max(oracle_bytes(spec, tokens, decode_rows, prefill_rows),
                      qkv_input ? pre_attention_check_bytes(spec, tokens) : 0.0);
  return n;
}

std::int64_t host_memory_available(std::string& source, const char* meminfo) {
  std::ifstream f(meminfo);
  std::string line;
  while (std::getline(f, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %lld kB", &kib) == 1 && kib >= 0) {
      source = std::string("MemAvailable in ") + meminfo;
      return std::int64_t(kib) * 1024;
    }
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) {
    source = "free physical pages (sysconf)";
    return std::int64_t(pages) * page;
  }
  source = "unknown";
  return 0;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::int64_t parse_bytes(const std::string& text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [rest, ec] = std::from_chars(text.data(), end, value);
  MSA_CHECK(ec == std::errc() && value >= 0 && rest != text.data(), "'", text,
            "' is not a size (bytes, or a number with K, M, G or T)");
  const std::string unit(rest, end);
  int shift = 0;
  if (unit == "K" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GiB") shift = 30;
  else if (unit == "T" || unit == "TiB") shift = 40;
  else MSA_CHECK(unit.empty(), "'", text, "' has an unknown unit '", unit, "' (K, M, G or T)");
  MSA_CHECK(value <= (std::int64_t(1) << (62 - shift)), "'", text, "' is more than 2^62 bytes");
  return value << shift;
}

std::string unwritable_reason(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (path.empty()) return "the path is empty";
  if (fs::is_directory(p, ec)) return "it is a directory";
  if (fs::exists(p, ec)) return access(path.c_str(), W_OK) == 0 ? "" : "the file is not writable";
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::exists(dir, ec)) return "the directory " + dir.string() + " does not exist";
  if (!fs::is_directory(dir, ec)) return dir.string() + " is not a directory";
  if (access(dir.c_str(), W_OK | X_OK) != 0) return "the directory " + dir.string() + " is not writable";
  return "";
}

}  // namespace msa::tool
