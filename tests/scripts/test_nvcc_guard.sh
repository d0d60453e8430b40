#!/usr/bin/env bash
# scripts/nvcc_guard.sh, the kernel libraries' CUDA compiler launcher: a compile
# whose ptxas output reports serialized wgmma fails with a message naming it;
# any other compile keeps its own status and output. Stand-in compilers (sh -c)
# print what ptxas prints, so this runs without nvcc.
set -uo pipefail
guard="$(dirname "$0")/../../scripts/nvcc_guard.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(bash "$guard" sh -c 'echo "ptxas info    : Used 168 registers, used 16 barriers" >&2' 2>&1) ||
  fail "a clean compile failed: $out"
[[ $out == *"Used 168 registers"* ]] || fail "the compiler's output was not passed on: $out"

serialized='ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized due to program dependence on compiler-inserted WG.DP in divergent path'
out=$(bash "$guard" sh -c "echo '$serialized' >&2" 2>&1) && fail "a compile with serialized wgmma passed"
[[ $out == *"error: ptxas serialized the wgmma instructions"* ]] || fail "no error message: $out"
[[ $out == *"(C7518)"* ]] || fail "ptxas's own message was not passed on: $out"

bash "$guard" sh -c 'exit 3' 2>/dev/null
rc=$?
[[ $rc -eq 3 ]] || fail "a failing compile returned $rc, not its own status 3"
echo "nvcc_guard: 3 cases passed"
