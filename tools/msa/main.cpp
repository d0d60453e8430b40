// The msa command: a CLI11 app with one subcommand per file. A subcommand is
// added with one registration call below.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "command.hpp"
#include "msa_build_info.hpp"
#if MSA_HAVE_CUDA
#include "cuda/commands.hpp"
#endif
#include "msa/error.hpp"

int main(int argc, char** argv) {
  using namespace msa::tool;
  CLI::App app{"msa: MiniMax-M3 block-sparse attention (CPU engine and Hopper CUDA backend)",
               "msa"};
  app.require_subcommand(1);
  app.fallthrough(false);
  // msa --version: e.g. "msa 0.1.0 (commit 647b4f4a1c2e, Release; CPU engine, CUDA sm_90a)".
  const std::string version = std::string("msa ") + kVersion + " (commit " + kCommit + ", " +
                              kBuildType + "; " + kBackends + ")";
  app.set_version_flag("--version", version, "Print the version, commit and backends, then exit");

  std::vector<Command> commands;
  commands.push_back(add_run_command(app));
#if MSA_HAVE_CUDA
  commands.push_back(register_check(app));
  commands.push_back(register_bench(app));
  commands.push_back(register_bench_cp(app));
#endif

  // A first word that is neither --help nor a command: name it.
  const std::string first = argc > 1 ? argv[1] : "";
  if (!first.empty() && first[0] == '-' && first != "-h" && first != "--help" &&
      first != "--version") {
    std::fprintf(stderr, "msa: unknown option '%s' (options follow the command: msa run --help)\n",
                 argv[1]);
    return kExitUsage;
  }
  if (!first.empty() && first[0] != '-') {
    bool known = false;
    std::string names;
    for (const Command& c : commands) {
      known |= c.app->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + c.app->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "msa: '%s' is not a command (commands: %s; see msa --help)\n", argv[1],
                   names.c_str());
      return kExitUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message (or the help)
    return code == 0 ? kExitOk : kExitUsage;
  }
  try {
    for (const Command& c : commands) {
      if (c.app->parsed()) return c.run();
    }
    std::fprintf(stderr, "msa: error: no subcommand given\n");
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const msa::Error& e) {
    std::fprintf(stderr, "msa: error: %s\n", e.what());
    return kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "msa: internal error: %s\n", e.what());
    return kExitFailed;
  }
}
