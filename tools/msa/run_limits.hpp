// What `msa run` refuses before it allocates or computes anything: a step that
// needs more host memory than the machine has, an output file it could not
// write. (The device side is run_cuda.hpp's.)
#pragma once

#include <cstdint>
#include <string>

#include "workload.hpp"

namespace msa::tool {

// Host bytes of one `msa run` step: the workload, the CPU engine's scratch
// (when the CPU runs the step) and the float64 oracle of the sampled rows.
struct HostNeed {
  WorkloadBytes workload;
  double engine = 0;
  double oracle = 0;
  double total() const { return workload.total() + engine + oracle; }
};
HostNeed host_need(const WorkloadSpec& spec, bool cpu_engine, int threads, int decode_rows, int prefill_rows);

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
