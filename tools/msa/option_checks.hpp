// CLI11 checks of numeric options that say what is wrong: not a number, or
// out of range and why ("--batch: 99999 is not in [0, 4096] (decode requests)").
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace msa::tool {

// A whole number in [lo, hi]; `what` says what the number counts.
CLI::Validator integer_in(std::int64_t lo, std::int64_t hi, const std::string& what);
// One of `values`; `what` says what they are.
CLI::Validator integer_of(std::initializer_list<std::int64_t> values, const std::string& what);
// A whole number in [0, 2^64 - 1] (no sign).
CLI::Validator unsigned_64();

}  // namespace msa::tool
