// The GPU subcommands of `msa`, built only with the CUDA backend (MSA_HAVE_CUDA):
//   msa check   randomized differential test of the GPU against the CPU engine
//   msa bench   timings of prefill, decode and verify on MiniMax-M3 shapes
//   msa bench-cp  context-parallel scaling of one layer step over 1..N GPUs
// Each call adds its sub-app to `msa` and returns the Command that runs it
// (command.hpp); main.cpp keeps it with the others:
//   #if MSA_HAVE_CUDA
//   commands.push_back(register_check(app));
//   commands.push_back(register_bench(app));
//   commands.push_back(register_bench_cp(app));
//   #endif
// Exit codes: 0 all passed / done, 1 a check failed or an error, 2 bad usage or
// no CUDA device.
#pragma once

#include <CLI/CLI.hpp>

#include "../command.hpp"

namespace msa::tool {

[[nodiscard]] Command register_check(CLI::App& app);
[[nodiscard]] Command register_bench(CLI::App& app);
[[nodiscard]] Command register_bench_cp(CLI::App& app);

}  // namespace msa::tool
