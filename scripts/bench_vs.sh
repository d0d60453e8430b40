#!/usr/bin/env bash
# Runs the same `msa bench` cases on this tree and on an earlier commit, on a
# GPU machine, for before/after figures in bench/RESULTS.md.
#
#   bash scripts/bench_vs.sh OLD "BENCH ARGS" [NAME]
#   (BENCH ARGS are word-split as a shell would: quote a case filter of several words)
#
# OLD: a commit, or a folder holding the old sources (made with
# `git archive COMMIT | tar -x -C DIR` where the machine's git lacks the commit).
#
# Builds msa_cli here (build-gpu) and at OLD (a copy under /tmp, with this
# tree's bench sources tools/msa/cuda/bench_* copied in so that both binaries
# know the same cases and count the same way), then runs `msa bench BENCH ARGS`
# with both, writing $OUT/NAME_new.json and $OUT/NAME_old.json and the tables
# to $OUT/logs. OWN_BENCH=1 builds OLD with its own bench sources instead (when
# this tree's bench needs library features OLD lacks; compare cases both know).
set -uo pipefail
OLD=$1; ARGS=$2; NAME=${3:-bench}
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT/logs"
build() {  # build DIR SRC
  cmake -S "$2" -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMSA_CUDA=ON -DMSA_TESTS=OFF >/dev/null &&
    cmake --build "$1" -j 16 --target msa_cli >"$OUT/logs/build_$(basename "$1").log" 2>&1
}
if [[ ! -d /tmp/msa_old ]]; then
  if [[ -d "$OLD" ]]; then
    cp -r "$OLD" /tmp/msa_old
  else
    git worktree prune
    git worktree add -f /tmp/msa_old "$OLD" >/dev/null 2>&1 || { echo "no worktree for $OLD"; exit 1; }
  fi
  [[ "${OWN_BENCH:-0}" == 1 ]] || cp tools/msa/cuda/bench_* /tmp/msa_old/tools/msa/cuda/
fi
build build-gpu . & build /tmp/msa_old/build /tmp/msa_old & wait
# The command is bin/msa; commits before that layout wrote it to the build folder's top.
old_bin=/tmp/msa_old/build/bin/msa
[[ -x $old_bin ]] || old_bin=/tmp/msa_old/build/msa
[[ -x build-gpu/bin/msa && -x $old_bin ]] || { tail -20 "$OUT"/logs/build_*.log; exit 1; }
# ARGS is word-split as a shell would, so that a case filter of several words can be quoted:
#   bash scripts/bench_vs.sh OLD "--set index --case 'decode b=128'"
eval "build-gpu/bin/msa bench $ARGS --json \"\$OUT/\${NAME}_new.json\"" >"$OUT/logs/${NAME}_new.txt" 2>&1
eval "\"\$old_bin\" bench $ARGS --json \"\$OUT/\${NAME}_old.json\"" >"$OUT/logs/${NAME}_old.txt" 2>&1
echo "== new"; cat "$OUT/logs/${NAME}_new.txt"; echo "== old ($OLD)"; cat "$OUT/logs/${NAME}_old.txt"
