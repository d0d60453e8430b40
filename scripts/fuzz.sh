#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan) in build-fuzz/
# and runs each for a bounded time from its seed corpus in fuzz/corpus/<target>/
# (new inputs go to a scratch copy, not into the repository). Any crash,
# sanitizer finding or broken property fails the run; the input that caused it
# is left in build-fuzz/findings/.
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(metadata k2q views cpu_ops)

# clang and its libFuzzer runtime, from Debian's packages when missing.
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends clang libclang-rt-dev
fi

cmake -S fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None >/dev/null
cmake --build build-fuzz -j"$(nproc)"

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p build-fuzz/findings
status=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  rm -rf "$work" && mkdir -p "$work"
  echo "fuzz_$t: ${seconds} s from $(ls fuzz/corpus/$t | wc -l) seeds"
  if ! "build-fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=4096 \
      -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$t-" "$work" "fuzz/corpus/$t" \
      > "build-fuzz/fuzz_$t.log" 2>&1; then
    echo "fuzz_$t FAILED (log: build-fuzz/fuzz_$t.log):"
    tail -n 40 "build-fuzz/fuzz_$t.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "build-fuzz/fuzz_$t.log" | tr '\n' ' '
    echo
  fi
done
exit $status
