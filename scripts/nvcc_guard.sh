#!/usr/bin/env bash
# CUDA compiler launcher of the kernel libraries (src/cuda/CMakeLists.txt):
# runs the compile command it is given and fails it when ptxas reports that it
# serialized the wgmma instructions of a kernel ("Potential Performance Loss:
# wgmma.mma_async instructions are serialized ...", C7518 for a wgmma under a
# branch). ptxas prints that as "info", so the build would pass; the one such
# kernel measured (bench/RESULTS.md in git history) ran 36-48% slower.
#
#   nvcc_guard.sh COMPILER ARGS...
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>"$log"
rc=$?
cat "$log" >&2
if [[ $rc -eq 0 ]] && grep -q "wgmma.mma_async instructions are serialized" "$log"; then
  echo "error: ptxas serialized the wgmma instructions (message above). Keep each wgmma group, its commit" \
    "and its wait in straight-line code that every thread of the warpgroup runs (no per-warp branch around" \
    "them), and keep the accumulators in registers." >&2
  exit 1
fi
exit $rc
