// The `msa` command as a user runs it: bad options exit 2 with a message, so
// does a step it cannot serve (memory, output file), before any work; a
// library error exits 1 as "msa: error: ...", and `msa run` on tiny workloads
// (several dtypes, layouts and TP degrees) passes its oracle check and exits 0.
//
// The binary is $MSA_BIN, or this build's command (MSA_CLI_PATH, set by
// tests/CMakeLists.txt: build/bin/msa).
#include <dlfcn.h>
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

// CUDA devices the driver reports, asked directly (not through msa); 0 without
// a driver.
int driver_devices() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  const auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  const auto count = reinterpret_cast<Count>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0) n = 0;
  return n;
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
        Case{"run --layout xyz", "layout"}, Case{"run --topk 65", "--topk: 65 is not in [1, 64]"},
        Case{"run --batch -1", "--batch: -1 is not in [0, 4096] (decode requests)"},
        Case{"run --batch 99999", "--batch: 99999 is not in [0, 4096]"},
        Case{"run --batch 1.5", "--batch: '1.5' is not a whole number"},
        Case{"run --context 16777217", "--context: 16777217 is not in [0, 16777216]"},
        Case{"run --tp abc", "--tp: 'abc' is not a whole number"},
        Case{"run --tp 3", "--tp: 3 is not one of 1, 2, 4, 8"},
        Case{"run --seed banana", "--seed: 'banana' is not a whole number"},
        Case{"run --seed -1", "--seed: -1 is not in [0, 2^64 - 1]"},
        Case{"run --seed 99999999999999999999", "--seed: 99999999999999999999 is above 2^64 - 1"},
        Case{"run --threads 5000", "--threads: 5000 is not in [0, 1024]"},
        Case{"run --host-memory 3X", "--host-memory: '3X' has an unknown unit"},
        Case{"run --decode-context-min 9 --decode-context-max 3", "--decode-context-max"},
        Case{"run --batch 0 --prefill-tokens 0", "empty"}, Case{"run --backend tpu", "--backend"},
        // Options that do not apply to the chosen cache dtype.
        Case{"run --kv-scales token", "--kv-scales: token applies to fp8 caches only (--kv-dtype bf16 has no scales)"},
        Case{"run --kv-dtype fp16 --kv-scales tensor", "--kv-scales: tensor applies to fp8 caches only"},
        Case{"run --kv-dtype nvfp4 --kv-scales token", "--kv-dtype nvfp4 has group scales"},
        Case{"run --kv-dtype nvfp4 --layout split", "--layout: split does not apply to an nvfp4 cache"},
        Case{"run --index-dtype fp16", "not an index cache dtype (bf16, fp8_e4m3, nvfp4)"},
        Case{"run --input q", "--input"},
        Case{"frobnicate", "frobnicate"}, Case{"", "subcommand"}}) {
    SCOPED_TRACE(std::string("msa ") + c.args);
    const Result r = run_msa(c.args);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, c.needle)) << r.output;
  }
}

TEST(Cli, CudaBackendIsRefusedClearly) {
  // --backend cuda runs where it can (a CUDA build and a device the driver
  // reports) and otherwise exits 2 saying which of the two is missing.
  const bool cuda_build = run_msa("check --help").code == 0;  // `check` exists only in CUDA builds
  const int devices = driver_devices();
  SCOPED_TRACE(testing::Message() << "CUDA build: " << cuda_build << ", devices: " << devices);
  const Result r = run_msa(kTiny + "--backend cuda");
  if (!cuda_build) {
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "built without the CUDA backend")) << r.output;
  } else if (devices == 0) {
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "no CUDA device is visible")) << r.output;
  } else {
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "engine  cuda (")) << r.output;
    EXPECT_TRUE(contains(r.output, "PASS")) << r.output;
    return;
  }
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
  // /dev/full can be opened but not written: found only when the report is.
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const Result r = run_msa(kTiny + "--json /dev/full");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "msa: error: --json /dev/full: cannot write the file")) << r.output;
}

TEST(Cli, OutputPathIsCheckedBeforeWork) {
  // Refused before the setup starts.
  for (const char* path : {"/nonexistent-dir/report.json", "/"}) {
    SCOPED_TRACE(path);
    const Result r = run_msa("run --threads 2 --json " + std::string(path));
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, std::string("--json: ") + path + " cannot be written: ")) << r.output;
    EXPECT_FALSE(contains(r.output, "msa run: [")) << r.output;  // no progress line
  }
  EXPECT_TRUE(contains(run_msa("run --json /nonexistent-dir/report.json").output,
                       "the directory /nonexistent-dir does not exist"));
  EXPECT_TRUE(contains(run_msa("run --json /").output, "it is a directory"));
}

TEST(Cli, MemoryIsEstimatedBeforeAllocating) {
  // Under a given limit: the estimate, its parts and the limit, exit 2, no work.
  const Result r = run_msa("run --batch 1024 --host-memory 1G");
  EXPECT_EQ(r.code, 2) << r.output;
  for (const char* word : {"needs about ", " GiB of host memory (KV cache ", "oracle checks", "the limit is 1.0 GiB (--host-memory)"})
    EXPECT_TRUE(contains(r.output, word)) << "no '" << word << "' in\n" << r.output;
  EXPECT_FALSE(contains(r.output, "msa run: [")) << r.output;  // no progress line
  // Under the machine's own limit: 4096 decodes of 16M tokens are tens of TiB.
  const Result huge = run_msa("run --batch 4096 --decode-context-min 16777216 --decode-context-max 16777216");
  EXPECT_EQ(huge.code, 2) << huge.output;
  EXPECT_TRUE(contains(huge.output, " TiB of host memory")) << huge.output;
  EXPECT_TRUE(contains(huge.output, "MemAvailable") || contains(huge.output, "sysconf")) << huge.output;
  // The same tiny step runs under a limit it fits.
  EXPECT_EQ(run_msa(kTiny + "--host-memory 2G").code, 0);
}

TEST(Cli, TinyRunPasses) {
  const fs::path json =
      fs::temp_directory_path() / ("msa_test_cli_" + std::to_string(getpid()) + ".json");
  const Result r = run_msa(kTiny + "--seed 7 --json '" + json.string() + "'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "PASS")) << r.output;
  for (const char* word :
       {"decode", "prefill", "insert", "index", "attend", "relative Frobenius", "lse", "pre-attn",
        "float64 norm + RoPE"}) {
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
        "--prefill-tokens 0 --batch 5 --draft-tokens 3", "--input kv --kv-dtype fp8_e4m3 --kv-scales token"}) {
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
