#include "verify.hpp"

#include <algorithm>

namespace msa::fuzz {

void expect_disjoint(std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].second > ranges[i].first) __builtin_trap();
  }
}

}  // namespace msa::fuzz
