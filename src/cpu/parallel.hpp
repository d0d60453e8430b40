// parallel_for over the CPU engine's threads.
#pragma once

#include <cstdint>
#include <functional>

namespace msa::cpu {

// Threads to use for `requested` (0: one per hardware thread, at least 1).
int resolve_threads(int requested);

// Calls fn(begin, end) on disjoint chunks covering [0, n), on up to
// `num_threads` threads (the calling thread is one of them). Chunks are handed
// out dynamically in pieces of `grain` items so uneven rows balance. The first
// exception thrown by fn is rethrown on the calling thread.
void parallel_for(std::int64_t n, int num_threads, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn);

}  // namespace msa::cpu
