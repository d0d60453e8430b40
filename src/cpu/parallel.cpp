#include "cpu/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "msa/error.hpp"

namespace msa::cpu {

void check_options(const Options& opt) {
  MSA_CHECK(opt.num_threads >= 0 && opt.num_threads <= kMaxThreads, "options.num_threads = ", opt.num_threads,
            " is not in [0, ", kMaxThreads, "] (0: one per hardware thread)");
}

int resolve_threads(int requested) {
  if (requested > 0) return std::min(requested, kMaxThreads);
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(std::min<unsigned>(hw, kMaxThreads));
}

void parallel_for(std::int64_t n, int num_threads, std::int64_t grain,
                  const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t chunks = (n + grain - 1) / grain;
  const int threads = int(std::min<std::int64_t>(resolve_threads(num_threads), chunks));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (;;) {
      const std::int64_t c = next.fetch_add(1);
      if (c >= chunks) return;
      try {
        fn(c * grain, std::min(n, (c + 1) * grain));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(chunks);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  try {
    for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  } catch (const std::system_error&) {
    // The system is out of threads: the ones started (and this one) take every chunk.
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace msa::cpu
