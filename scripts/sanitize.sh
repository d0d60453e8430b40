#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer and UndefinedBehaviorSanitizer
# (g++, any finding fails the run), in build-sanitize/. The CUDA backend is
# not built: its kernels are checked by compute-sanitizer (scripts/device.sh).
# test_install is left out: it links the installed (here: instrumented)
# library into programs built without the sanitizers.
#   bash scripts/sanitize.sh [CTEST_ARGS...]     e.g. -R Unchecked
set -euo pipefail
cd "$(dirname "$0")/.."

flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build-sanitize -G Ninja -DMSA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=g++ -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-sanitize -j"$(nproc)"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-sanitize -L cpu -E '^test_install$' --output-on-failure -j"$(nproc)" "$@"
