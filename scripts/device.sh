#!/usr/bin/env bash
# One call on a GPU machine (an H200): configure and build
# for sm_90a with ninja, run the GPU tests, optionally the sanitizer pass and the
# benchmarks, and leave logs and JSON under $OUT.
#
#   bash scripts/device.sh [--tests REGEX] [--cpu-tests] [--sanitize] [--run] [--check ARGS]
#                          [--bench ARGS] [--bench-cp ARGS] [--ncu ARGS] [--examples] [--targets "T1 T2"]
#                          [--no-gpu-tests]
#
#   --tests REGEX   only GPU tests whose name matches (ctest -R)
#   --cpu-tests     also run the CPU test label
#   --sanitize      run every GPU test binary under compute-sanitizer memcheck,
#                   and racecheck on the attention and indexer tests (SAN_TESTS:
#                   a regex as for --tests, default the --tests one)
#   --run           run `msa run --backend cuda` (the default workload) -> $OUT/run.json
#   --check ARGS    run `msa check ARGS` (e.g. "--quick") -> $OUT/check.json
#   --bench ARGS    run `msa bench ARGS` (use "" for the default sweep) -> $OUT/bench.json
#   --bench-cp ARGS run `msa bench-cp ARGS` (context parallelism over the visible
#                   GPUs; "" for its default cases) -> $OUT/bench_cp.json
#   --ncu ARGS      profile the kernels of `msa bench ARGS` (one replay per case;
#                   e.g. "--set index --case 'decode 16/1 nvfp4 ctx=128K b=128'")
#                   with Nsight Compute's throughput, scheduler, warp-state and
#                   instruction sections -> logs/ncu.txt (NCU_KERNELS: a kernel-name
#                   regex, NCU_LAUNCHES: kernels profiled, default 4)
#   --examples      install the build to $BUILD/install, build examples/ against it
#                   (find_package(msa)) and run the three examples
#   --no-gpu-tests  skip the GPU test label (e.g. a bench-only call)
#   --targets LIST  build only these targets (default: everything)
set -uo pipefail
# Each optional section runs under its own time limit (seconds) so that one slow
# part cannot eat a whole device call: SAN_LIMIT, CHECK_LIMIT, BENCH_LIMIT.
SAN_LIMIT=${SAN_LIMIT:-240}; CHECK_LIMIT=${CHECK_LIMIT:-180}; BENCH_LIMIT=${BENCH_LIMIT:-300}
OUT=${OUT:-$PWD/out}
# A remote runner may return few files: logs go to $OUT/logs and are packed
# into $OUT/logs.tar.gz at the end; JSON results stay at the top of $OUT.
LOG="$OUT/logs"
mkdir -p "$LOG"
BUILD=${BUILD:-build-gpu}
TESTS=""; CPU=0; SAN=0; BENCH=0; BENCH_ARGS=""; TARGETS=""; RUN=0; CHECK=0; CHECK_ARGS=""; GPU_TESTS=1
NCU=0; NCU_ARGS=""; BENCH_CP=0; BENCH_CP_ARGS=""
EXAMPLES=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tests) TESTS="$2"; shift 2 ;;
    --cpu-tests) CPU=1; shift ;;
    --sanitize) SAN=1; shift ;;
    --bench) BENCH=1; BENCH_ARGS="$2"; shift 2 ;;
    --bench-cp) BENCH_CP=1; BENCH_CP_ARGS="$2"; shift 2 ;;
    --ncu) NCU=1; NCU_ARGS="$2"; shift 2 ;;
    --run) RUN=1; shift ;;
    --check) CHECK=1; CHECK_ARGS="$2"; shift 2 ;;
    --no-gpu-tests) GPU_TESTS=0; shift ;;
    --examples) EXAMPLES=1; shift ;;
    --targets) TARGETS="$2"; shift 2 ;;
    *) echo "device.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
SAN_TESTS=${SAN_TESTS:-$TESTS}
status=0
step() { echo "== $* ($(date +%T))"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"

step "configure"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON -DMSA_TESTS=ON -DMSA_WERROR=OFF \
  >"$LOG/configure.log" 2>&1 || { tail -30 "$LOG/configure.log"; tar czf "$OUT/logs.tar.gz" -C "$LOG" .; exit 1; }
step "build"
if [[ -n "$TARGETS" ]]; then
  cmake --build "$BUILD" -j 16 --target $TARGETS >"$LOG/build.log" 2>&1
else
  cmake --build "$BUILD" -j 16 >"$LOG/build.log" 2>&1
fi
rc=$?
grep -E "warning|error" "$LOG/build.log" | grep -v "^ninja" | head -40
if [[ $rc -ne 0 ]]; then tail -40 "$LOG/build.log"; tar czf "$OUT/logs.tar.gz" -C "$LOG" .; exit 1; fi
grep -A2 "ptxas info" "$LOG/build.log" >/dev/null 2>&1 || true

if [[ $GPU_TESTS -eq 1 ]]; then
  step "gpu tests"
  args=(--test-dir "$BUILD" -L gpu --output-on-failure --timeout "${TEST_TIMEOUT:-600}")
  [[ -n "$TESTS" ]] && args+=(-R "$TESTS")
  ctest "${args[@]}" >"$LOG/gpu_tests.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|Failed|\*\*\*" "$LOG/gpu_tests.log" | head -40
  cp "$BUILD/Testing/Temporary/LastTest.log" "$LOG/gpu_tests_full.log" 2>/dev/null || true
fi

if [[ $CPU -eq 1 ]]; then
  step "cpu tests"
  ctest --test-dir "$BUILD" -L cpu -j 16 --output-on-failure >"$LOG/cpu_tests.log" 2>&1 || status=1
  tail -5 "$LOG/cpu_tests.log"
fi

if [[ $SAN -eq 1 ]]; then
  step "compute-sanitizer"
  : >"$LOG/sanitizer.log"
  for t in "$BUILD"/tests/test_cuda_*; do
    [[ -x "$t" ]] || continue
    name=$(basename "$t")
    filter=""
    # The ctest regex's alternatives "A|B" as a gtest filter "*A*:*B*".
    [[ -n "$SAN_TESTS" ]] && filter="--gtest_filter=*${SAN_TESTS//|/*:*}*"
    # compute-sanitizer fails a program that makes no CUDA call: skip binaries the filter empties.
    [[ -n "$filter" ]] && ! "$t" $filter --gtest_list_tests 2>/dev/null | grep -q "^  " && continue
    echo "-- memcheck $name" | tee -a "$LOG/sanitizer.log"
    MSA_SANITIZER=1 timeout $SAN_LIMIT compute-sanitizer --tool memcheck --error-exitcode 9 "$t" $filter >>"$LOG/sanitizer.log" 2>&1 \
      || { echo "memcheck FAILED: $name"; status=1; }
    case "$name" in
      *attention*|*indexer*)
        echo "-- racecheck $name" | tee -a "$LOG/sanitizer.log"
        MSA_SANITIZER=1 timeout $SAN_LIMIT compute-sanitizer --tool racecheck --error-exitcode 9 "$t" $filter >>"$LOG/sanitizer.log" 2>&1 \
          || { echo "racecheck FAILED: $name"; status=1; } ;;
    esac
  done
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED" "$LOG/sanitizer.log" | head -40
fi

if [[ $RUN -eq 1 ]]; then
  step "msa run --backend cuda"
  "$BUILD"/bin/msa run --backend cuda --quiet --json "$OUT/run.json" >"$LOG/run.txt" 2>&1 || status=1
  tail -14 "$LOG/run.txt"
fi

if [[ $CHECK -eq 1 ]]; then
  step "msa check"
  timeout $CHECK_LIMIT "$BUILD"/bin/msa check $CHECK_ARGS --json "$OUT/check.json" >"$LOG/check.txt" 2>&1 || status=1
  tail -25 "$LOG/check.txt"
fi

if [[ $BENCH -eq 1 ]]; then
  step "bench"
  # BENCH_ARGS is word-split as a shell would (its case names are quoted).
  eval "timeout $BENCH_LIMIT $(printf '%q' "$BUILD/bin/msa") bench $BENCH_ARGS --json $(printf '%q' "$OUT/bench.json")" 2>&1 |
    tee "$LOG/bench.txt" || status=1
fi
if [[ $BENCH_CP -eq 1 ]]; then
  step "bench-cp"
  eval "timeout $BENCH_LIMIT $(printf '%q' "$BUILD/bin/msa") bench-cp $BENCH_CP_ARGS --json $(printf '%q' "$OUT/bench_cp.json")" 2>&1 |
    tee "$LOG/bench_cp.txt" || status=1
fi
if [[ $NCU -eq 1 ]]; then
  # The clocks are left as the GPU sets them (--clock-control none), so that
  # durations compare with the bench's.
  step "ncu"
  kargs=(--launch-count "${NCU_LAUNCHES:-4}")
  [[ -n "${NCU_KERNELS:-}" ]] && kargs+=(--kernel-name "regex:${NCU_KERNELS}")
  # NCU_ARGS is word-split as a shell would (its case names are quoted).
  eval "timeout $BENCH_LIMIT ncu --clock-control none $(printf '%q ' "${kargs[@]}") --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section LaunchStats --section Occupancy \
    $(printf '%q' "$BUILD/bin/msa") bench $NCU_ARGS --iters 1 --warmup 0 --settle-ms 0 --ceiling-replays 1" \
    >"$LOG/ncu.txt" 2>&1 || status=1
  grep -E "^  [a-z_ ]*[a-zA-Z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Instructions  |Eligible Warps" \
    "$LOG/ncu.txt" | head -60
fi
if [[ $EXAMPLES -eq 1 ]]; then
  # As a consumer would: the installed package, then examples/ with find_package(msa).
  # (The examples need the installed targets: with --targets, include the default set.)
  step "examples"
  prefix="$(cd "$BUILD" && pwd)/install"
  { cmake --install "$BUILD" --prefix "$prefix" &&
      cmake -S examples -B "$BUILD/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" &&
      cmake --build "$BUILD/examples" -j 16; } >"$LOG/examples_build.log" 2>&1 ||
    { tail -30 "$LOG/examples_build.log"; status=1; }
  for e in cpu_decode gpu_decode_graph gpu_prefill_k2q; do
    echo "-- $e"
    timeout 120 "$BUILD/examples/$e" 2>&1 | tee "$LOG/example_$e.txt"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "example FAILED: $e"; status=1; }
  done
fi
tar czf "$OUT/logs.tar.gz" -C "$LOG" . && rm -rf "$LOG"
step "done (status $status)"
exit $status
