// The library's one error type. Every public entry point reports bad input by
// throwing msa::Error with a message that names the argument, the index and
// the value; nothing in the library calls exit().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace msa {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Throws msa::Error built from the streamed pieces, e.g.
//   fail("topk[t=", t, ", h=", h, ", k=", k, "] = ", id, " but request ", r, " has ", n, " blocks");
template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(detail::concat(std::forward<Args>(args)...));
}

}  // namespace msa

// Throws msa::Error with the streamed message when the condition is false.
#define MSA_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::msa::fail(__VA_ARGS__);   \
  } while (0)
