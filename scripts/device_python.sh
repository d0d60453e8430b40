#!/usr/bin/env bash
# The Python package on a GPU machine, without network: build the extension
# (and the msa command) with CUDA in the CMake build tree, run the pytest suite
# (GPU tests included) with the machine's python3, torch and nanobind, and
# optionally time the decode step's CUDA-graph replay through Python against
# `msa bench`. Logs and JSON go to $OUT (default ./out).
#
#   bash scripts/device_python.sh [--tests EXPR] [--no-tests] [--bench [CASES]] [--pip]
#
#   --tests EXPR   pytest -k EXPR (default: every test, the GPU ones and the others)
#   --no-tests     no pytest (e.g. a timing-only call)
#   --bench [CASES] run python/bench/decode_graph.py (its default cases, or
#                  space-separated HEADS:KV_DTYPE:CONTEXT:BATCH:QUERY_LEN)
#                  -> $OUT/decode_graph.json
#   --pip          install with `pip install --no-build-isolation --no-deps .`
#                  into $PYTHON's environment instead (a wheel build, slower)
#   env PYTHON (python3), BUILD (build-gpu), JOBS (16)
set -uo pipefail
OUT=${OUT:-$PWD/out}
LOG="$OUT/logs"
mkdir -p "$LOG"
PY=${PYTHON:-python3}
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-16}
TESTS=""; RUN_TESTS=1; BENCH=0; BENCH_CASES=""; PIP=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tests) TESTS="$2"; shift 2 ;;
    --no-tests) RUN_TESTS=0; shift ;;
    --bench) BENCH=1; shift; if [[ $# -gt 0 && $1 != --* ]]; then BENCH_CASES=$1; shift; fi ;;
    --pip) PIP=1; shift ;;
    *) echo "device_python.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="/usr/local/cuda/bin:$PATH"
status=0
step() { echo "== $* ($(date +%T))"; }
finish() { tar czf "$OUT/logs.tar.gz" -C "$LOG" .; exit "$1"; }

step "machine"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$PY" -c "import sys, torch, nanobind; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'nanobind', nanobind.__version__)"

if [[ $PIP -eq 1 ]]; then
  step "pip install --no-build-isolation --no-deps ."
  "$PY" -m pip install --no-build-isolation --no-deps -Ccmake.define.MSA_CUDA=ON . >"$LOG/pip.log" 2>&1 \
    || { tail -40 "$LOG/pip.log"; finish 1; }
  MSA_CMD=$("$PY" -c "import sysconfig; print(sysconfig.get_path('scripts'))")/msa
  PYPATH=""
else
  step "configure ($BUILD, MSA_PYTHON=ON)"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON -DMSA_WERROR=OFF -DMSA_PYTHON=ON \
    -DPython_EXECUTABLE="$(command -v "$PY")" >"$LOG/py_configure.log" 2>&1 || { tail -30 "$LOG/py_configure.log"; finish 1; }
  step "build _msa msa_cli"
  cmake --build "$BUILD" -j "$JOBS" --target _msa msa_cli >"$LOG/py_build.log" 2>&1 || { tail -40 "$LOG/py_build.log"; finish 1; }
  grep -E "warning|error" "$LOG/py_build.log" | grep -v "^ninja" | head -20
  MSA_CMD="$PWD/$BUILD/bin/msa"
  PYPATH="$PWD/$BUILD/python"
fi

if [[ $RUN_TESTS -eq 1 ]]; then
  step "pytest"
  args=(python/tests -q -rs)
  [[ -n "$TESTS" ]] && args+=(-k "$TESTS")
  PYTHONPATH="$PYPATH" "$PY" -m pytest "${args[@]}" 2>&1 | tee "$LOG/pytest.log" | tail -25
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

if [[ $BENCH -eq 1 ]]; then
  step "decode_graph.py"
  cases=()
  for c in $BENCH_CASES; do cases+=(--case "$c"); done
  PYTHONPATH="$PYPATH" "$PY" python/bench/decode_graph.py --msa "$MSA_CMD" "${cases[@]}" \
    --json "$OUT/decode_graph.json" 2>&1 | tee "$LOG/decode_graph.txt" || status=1
fi
finish $status
