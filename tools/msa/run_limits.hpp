// What `msa run` refuses before it allocates or computes anything: a step that
// needs more host memory than the machine has, an output file it could not
// write. (The device side is run_cuda.hpp's.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "workload.hpp"

namespace msa::tool {

// Host bytes of one `msa run` step: the workload (with the qkv rows when the
// step starts from them), which lives throughout, and the scratch of the
// stages that follow one another: the workload's setup, the CPU engine (when
// the CPU runs the step), the float64 checks (the oracle of the sampled rows,
// then every token's pre-attention outputs). The peak is the first plus the
// largest of the others, plus the program itself (code, libraries, stacks).
struct HostNeed {
  static constexpr double kProgram = 32.0 * 1024 * 1024;
  WorkloadBytes workload;
  double qkv = 0;
  double engine = 0;
  double oracle = 0;
  double total() const {
    return kProgram + workload.kv_cache + workload.index_cache + workload.step + qkv +
           std::max({workload.scratch, engine, oracle});
  }
};
HostNeed host_need(const WorkloadSpec& spec, bool qkv_input, bool cpu_engine, int threads, int decode_rows,
                   int prefill_rows);

// Bytes of host memory available now: MemAvailable of `meminfo` (a
// /proc/meminfo-format file), else the free physical pages sysconf reports;
// 0 when neither is known. `source` gets where the number came from.
std::int64_t host_memory_available(std::string& source, const char* meminfo = "/proc/meminfo");

// "1.5 GiB", "12.0 MiB", "512 B".
std::string format_bytes(double bytes);

// "4G", "512M", "64K" (powers of 1024) or plain bytes; throws msa::Error otherwise.
std::int64_t parse_bytes(const std::string& text);

// Why `path` cannot be created or overwritten ("" when it can): its directory
// is missing or not writable, or a directory or an unwritable file is in its place.
std::string unwritable_reason(const std::string& path);

}  // namespace msa::tool
