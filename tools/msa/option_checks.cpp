#include "option_checks.hpp"

#include <charconv>
#include <vector>

namespace msa::tool {

namespace {

// The number in `s` when all of it is one (a sign only where allowed), else why not.
template <typename T>
bool whole_number(const std::string& s, T& value, std::string& why) {
  const char* end = s.data() + s.size();
  const auto [rest, ec] = std::from_chars(s.data(), end, value);
  if (s.empty() || rest != end || ec == std::errc::invalid_argument) {
    why = "'" + s + "' is not a whole number";
    return false;
  }
  if (ec == std::errc::result_out_of_range) {
    why = s + " is out of range";
    return false;
  }
  return true;
}

}  // namespace

CLI::Validator integer_in(std::int64_t lo, std::int64_t hi, const std::string& what) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        std::int64_t v = 0;
        std::string why;
        if (!whole_number(s, v, why)) return why;
        if (v < lo || v > hi) return s + " is not in " + range + " (" + what + ")";
        return {};
      },
      "INT in " + range);
}

CLI::Validator integer_of(std::initializer_list<std::int64_t> values, const std::string& what) {
  const std::vector<std::int64_t> allowed(values);
  std::string list;
  for (std::int64_t v : allowed) list += (list.empty() ? "" : ", ") + std::to_string(v);
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        std::int64_t v = 0;
        std::string why;
        if (!whole_number(s, v, why)) return why;
        for (std::int64_t a : allowed)
          if (a == v) return {};
        return s + " is not one of " + list + " (" + what + ")";
      },
      "one of {" + list + "}");
}

CLI::Validator unsigned_64() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::uint64_t v = 0;
        std::string why;
        if (!s.empty() && (s[0] == '-' || s[0] == '+')) return s + " is not in [0, 2^64 - 1] (no sign)";
        if (!whole_number(s, v, why)) return why == s + " is out of range" ? s + " is above 2^64 - 1" : why;
        return {};
      },
      "UINT64");
}

}  // namespace msa::tool
