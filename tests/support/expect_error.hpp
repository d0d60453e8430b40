// GoogleTest helper shared by the test files: the call must throw msa::Error
// whose message mentions every given word (argument names, indices, values).
// Header-only; include it only from test executables (they link GoogleTest).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "msa/error.hpp"

namespace msa::test {

template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& words) {
  try {
    fn();
    ADD_FAILURE() << "no msa::Error thrown (expected one mentioning '" << (words.empty() ? "" : words[0])
                  << "')";
  } catch (const msa::Error& e) {
    for (const std::string& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << w << "'";
  }
}

template <typename Fn>
void expect_error(Fn&& fn, const std::string& word) {
  expect_error(std::forward<Fn>(fn), std::vector<std::string>{word});
}

// expect_error(fn, {"word", "other"}): a braced list picks this overload.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> words) {
  expect_error(std::forward<Fn>(fn), std::vector<std::string>(words));
}

}  // namespace msa::test
