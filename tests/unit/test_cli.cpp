// The `msa` command as a user runs it: bad options exit 2 with a message, a
// library error exits 1 as "msa: error: ...", and `msa run` on tiny workloads
// (several dtypes, layouts and TP degrees) passes its oracle check and exits 0.
//
// The binary is $MSA_BIN, or this build's command (MSA_CLI_PATH, set by
// tests/CMakeLists.txt: build/bin/msa).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

fs::path msa_binary() {
  if (const char* env = std::getenv("MSA_BIN")) return env;
  return MSA_CLI_PATH;
}

struct Result {
  int code = -1;       // exit status
  std::string output;  // stdout and stderr
};

Result run_msa(const std::string& args) {
  const fs::path bin = msa_binary();
  if (!fs::exists(bin)) {
    ADD_FAILURE() << "msa binary not found at " << bin
                  << " (build the msa_cli target, or set MSA_BIN)";
    return {};
  }
  std::string command = "'";
  command.append(bin.string()).append("' ").append(args).append(" 2>&1");
  Result r;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    ADD_FAILURE() << "cannot run " << command;
    return r;
  }
  std::array<char, 4096> buf;
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// Small contexts so that each run takes a fraction of a second.
const std::string kTiny =
    "run --quiet --threads 2 --batch 3 --decode-context-min 1 --decode-context-max 2500 "
    "--context 700 --prefill-tokens 131 ";

TEST(Cli, BadOptionsExit2WithAMessage) {
  struct Case {
    const char* args;
    const char* needle;
  };
  for (const Case& c :
       {Case{"run --bogus", "--bogus"}, Case{"run --tp 3", "--tp"},
        Case{"run --kv-dtype fp7", "fp7"}, Case{"run --kv-dtype f32", "KV cache dtype"},
        Case{"run --layout xyz", "layout"}, Case{"run --topk 65", "--topk"},
        Case{"run --index-dtype fp16", "not an index cache dtype (bf16, fp8_e4m3, nvfp4)"},
        Case{"run --batch -1", "--batch"}, Case{"run --seed banana", "--seed"},
        Case{"run --decode-context-min 9 --decode-context-max 3", "--decode-context-max"},
        Case{"run --batch 0 --prefill-tokens 0", "empty"}, Case{"run --backend tpu", "--backend"},
        Case{"frobnicate", "frobnicate"}, Case{"", "subcommand"}}) {
    SCOPED_TRACE(std::string("msa ") + c.args);
    const Result r = run_msa(c.args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, c.needle)) << r.output;
  }
}

TEST(Cli, CudaBackendIsRefusedClearly) {
  // Not wired into `msa run` yet: whatever the build, exit 2 and say why.
  const Result r = run_msa(kTiny + "--backend cuda");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "cuda")) << r.output;
  EXPECT_FALSE(contains(r.output, "PASS")) << r.output;
}

TEST(Cli, HelpExits0) {
  const Result r = run_msa("run --help");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--kv-dtype")) << r.output;
}

TEST(Cli, VersionNamesTheCommitAndBackends) {
  const Result r = run_msa("--version");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, std::string("msa ") + MSA_PROJECT_VERSION + " (commit ")) << r.output;
  EXPECT_TRUE(contains(r.output, "CPU engine")) << r.output;
  EXPECT_FALSE(contains(r.output, "commit )")) << r.output;
}

TEST(Cli, LibraryErrorExits1) {
  const Result r = run_msa(kTiny + "--json /nonexistent-dir/report.json");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "msa: error: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "report.json")) << r.output;
}

TEST(Cli, TinyRunPasses) {
  const fs::path json =
      fs::temp_directory_path() / ("msa_test_cli_" + std::to_string(getpid()) + ".json");
  const Result r = run_msa(kTiny + "--seed 7 --json '" + json.string() + "'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "PASS")) << r.output;
  for (const char* word :
       {"decode", "prefill", "insert", "index", "attend", "relative Frobenius", "lse"}) {
    EXPECT_TRUE(contains(r.output, word)) << "no '" << word << "' in\n" << r.output;
  }
  std::ifstream f(json);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_TRUE(contains(text.str(), "\"passed\": true")) << text.str();
  EXPECT_TRUE(contains(text.str(), "\"keys_attended\"")) << text.str();
  fs::remove(json);
}

TEST(Cli, TinyRunsPassAcrossDtypesLayoutsAndTp) {
  for (const char* extra :
       {"--tp 1 --kv-dtype fp8_e4m3 --layout nhd",
        "--tp 2 --kv-dtype fp8_e5m2 --kv-scales token --layout split",
        "--tp 8 --kv-dtype nvfp4 --index-dtype fp8_e4m3", "--kv-dtype fp16 --q-dtype fp16 --topk 5",
        "--q-dtype fp8_e4m3 --draft-tokens 0 --topk 64", "--batch 0 --prefill-tokens 300",
        "--prefill-tokens 0 --batch 5 --draft-tokens 3"}) {
    SCOPED_TRACE(std::string("msa ") + kTiny + extra);
    const Result r = run_msa(kTiny + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "PASS")) << r.output;
  }
}

// An fp8 or nvfp4 index cache passes the oracle check (on the values it holds)
// and reports how many of the bf16 index's blocks it keeps; a bf16 one reports none.
TEST(Cli, LowPrecisionIndexReportsItsAgreementWithBf16) {
  for (const char* dtype : {"fp8_e4m3", "nvfp4", "bf16"}) {
    SCOPED_TRACE(dtype);
    const fs::path json = fs::temp_directory_path() /
                          ("msa_test_cli_" + std::to_string(getpid()) + "_" + dtype + ".json");
    const Result r = run_msa(kTiny + "--backend cpu --seed 3 --index-dtype " + dtype + " --json '" +
                             json.string() + "'");
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "PASS")) << r.output;
    const bool low = std::string(dtype) != "bf16";
    EXPECT_EQ(contains(r.output, "against a bf16 index of the same keys"), low) << r.output;
    std::ifstream f(json);
    std::stringstream text;
    text << f.rdbuf();
    EXPECT_EQ(contains(text.str(), "\"fraction_kept\""), low) << text.str();
    if (!low) {
      EXPECT_TRUE(contains(text.str(), "\"index_agreement\": null")) << text.str();
    }
    fs::remove(json);
  }
}

}  // namespace
