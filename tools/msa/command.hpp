// A subcommand of the `msa` command: its CLI11 sub-app and what runs once the
// command line is parsed. Each subcommand lives in its own file and exposes one
// registration function; main.cpp calls them in order.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace msa::tool {

// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;      // done, and every check passed
inline constexpr int kExitFailed = 1;  // a check failed, or the library reported an error
inline constexpr int kExitUsage = 2;   // bad option, or a request this build cannot serve

struct Command {
  CLI::App* app = nullptr;   // the parsed sub-app (app->parsed() after parse)
  std::function<int()> run;  // runs the command, returns the exit code
};

// `msa run`: one synthetic engine step on the CPU engine, checked against the oracle (run.cpp).
Command add_run_command(CLI::App& msa);

}  // namespace msa::tool
