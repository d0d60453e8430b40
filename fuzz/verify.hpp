// Property checks of the fuzz targets that walk many rows. Built apart from
// the targets, without libFuzzer's coverage instrumentation, which would make
// their sorting the bulk of each run.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace msa::fuzz {

// Traps unless the byte ranges [first, second) are pairwise disjoint.
void expect_disjoint(std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges);

}  // namespace msa::fuzz
