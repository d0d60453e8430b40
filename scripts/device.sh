#!/usr/bin/env bash
# One call on a GPU machine (the H200 of the device tool): configure and build
# for sm_90a with ninja, run the GPU tests, optionally the sanitizer pass and the
# benchmarks, and leave logs and JSON under $OUT.
#
#   bash scripts/device.sh [--tests REGEX] [--cpu-tests] [--sanitize] [--bench ARGS] [--targets "T1 T2"]
#
#   --tests REGEX   only GPU tests whose name matches (ctest -R)
#   --cpu-tests     also run the CPU test label
#   --sanitize      run every GPU test binary under compute-sanitizer memcheck,
#                   and racecheck on the attention and indexer tests
#   --bench ARGS    run `msa bench ARGS` (use "" for the default sweep) -> $OUT/bench.json
#   --targets LIST  build only these targets (default: everything)
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
TESTS=""; CPU=0; SAN=0; BENCH=0; BENCH_ARGS=""; TARGETS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tests) TESTS="$2"; shift 2 ;;
    --cpu-tests) CPU=1; shift ;;
    --sanitize) SAN=1; shift ;;
    --bench) BENCH=1; BENCH_ARGS="$2"; shift 2 ;;
    --targets) TARGETS="$2"; shift 2 ;;
    *) echo "device.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
status=0
step() { echo "== $* ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"

step "configure"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON -DMSA_WERROR=OFF \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
step "build"
if [[ -n "$TARGETS" ]]; then
  cmake --build "$BUILD" -j 16 --target $TARGETS >"$OUT/build.log" 2>&1
else
  cmake --build "$BUILD" -j 16 >"$OUT/build.log" 2>&1
fi
rc=$?
grep -E "warning|error" "$OUT/build.log" | grep -v "^ninja" | head -40
if [[ $rc -ne 0 ]]; then tail -40 "$OUT/build.log"; exit 1; fi
grep -A2 "ptxas info" "$OUT/build.log" >/dev/null 2>&1 || true

step "gpu tests"
args=(--test-dir "$BUILD" -L gpu --output-on-failure --timeout 600)
[[ -n "$TESTS" ]] && args+=(-R "$TESTS")
ctest "${args[@]}" >"$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/gpu_tests.log" | head -40

if [[ $CPU -eq 1 ]]; then
  step "cpu tests"
  ctest --test-dir "$BUILD" -L cpu -j 16 --output-on-failure >"$OUT/cpu_tests.log" 2>&1 || status=1
  tail -5 "$OUT/cpu_tests.log"
fi

if [[ $SAN -eq 1 ]]; then
  step "compute-sanitizer"
  : >"$OUT/sanitizer.log"
  for t in "$BUILD"/tests/test_cuda_*; do
    [[ -x "$t" ]] || continue
    name=$(basename "$t")
    filter=""
    [[ -n "$TESTS" ]] && filter="--gtest_filter=*${TESTS}*"
    echo "-- memcheck $name" | tee -a "$OUT/sanitizer.log"
    MSA_SANITIZER=1 compute-sanitizer --tool memcheck --error-exitcode 9 "$t" $filter >>"$OUT/sanitizer.log" 2>&1 \
      || { echo "memcheck FAILED: $name"; status=1; }
    case "$name" in
      *attention*|*indexer*)
        echo "-- racecheck $name" | tee -a "$OUT/sanitizer.log"
        MSA_SANITIZER=1 compute-sanitizer --tool racecheck --error-exitcode 9 "$t" $filter >>"$OUT/sanitizer.log" 2>&1 \
          || { echo "racecheck FAILED: $name"; status=1; } ;;
    esac
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED" "$OUT/sanitizer.log" | head -40
fi

if [[ $BENCH -eq 1 ]]; then
  step "bench"
  "$BUILD"/msa bench $BENCH_ARGS --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" || status=1
fi
step "done (status $status)"
exit $status
