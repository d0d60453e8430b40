// parallel_for over the CPU engine's threads.
#pragma once

#include <cstdint>
#include <functional>

#include "msa/cpu.hpp"

namespace msa::cpu {

// The most threads an operation runs on (Options::num_threads, and what 0
// resolves to on a larger machine): each thread of attend holds its own cache
// of converted blocks, so a request for more is a mistake, not a machine.
inline constexpr int kMaxThreads = 1024;

// Throws msa::Error naming options.num_threads when it is outside [0, kMaxThreads].
void check_options(const Options& opt);

// Threads to use for `requested` (0: one per hardware thread; at least 1, at
// most kMaxThreads).
int resolve_threads(int requested);

// Calls fn(begin, end) on disjoint chunks covering [0, n), on up to
// `num_threads` threads (the calling thread is one of them). Chunks are handed
// out dynamically in pieces of `grain` items so uneven rows balance. The first
// exception thrown by fn is rethrown on the calling thread. Where the system
// gives fewer threads than asked, the ones it gave take every chunk.
void parallel_for(std::int64_t n, int num_threads, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

}  // namespace msa::cpu
