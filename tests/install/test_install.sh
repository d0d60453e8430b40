#!/usr/bin/env bash
# The installed package as a consumer uses it (ctest: test_install, label cpu):
#  1. installs the build BUILD into a fresh prefix under WORK and checks the
#     layout: public headers only, the library, the command, the CMake package
#     files and msa.pc;
#  2. configures, builds and runs examples/ against it through find_package(msa)
#     (the GPU examples are built, not run, when the package has msa::cuda);
#  3. builds and runs the CPU example once more with only pkg-config's flags;
#  4. configures the library alone (no command, no tests) with CLI11,
#     nlohmann-json and GoogleTest made unfindable: none of them may be needed.
#
#   test_install.sh BUILD SOURCE WORK GENERATOR CXX [CUDA_BIN_DIR]
set -euo pipefail
build=$1 source=$2 work=$3 generator=$4 cxx=$5 cuda_bin=${6:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"

echo "== install $build -> $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
pc=$(find "$prefix" -name msa.pc -path "*/pkgconfig/*")
[[ -n $pc ]] || fail "no msa.pc installed"
libdir=$(dirname "$(dirname "$pc")")
for f in "$prefix/include/msa/cpu.hpp" "$prefix/include/msa/slots.hpp" \
         "$libdir/cmake/msa/msaConfig.cmake" "$libdir/cmake/msa/msaConfigVersion.cmake" \
         "$libdir/cmake/msa/msaTargets.cmake"; do
  [[ -e $f ]] || fail "$f was not installed"
done
compgen -G "$libdir/libmsa.*" >/dev/null || fail "no libmsa in $libdir"
[[ -z $(find "$prefix/include" -path "*/core/*" -o -path "*/cpu/*" -o -path "*/cuda/*") ]] ||
  fail "private headers were installed"
if [[ -x $build/bin/msa ]]; then
  "$prefix/bin/msa" --version || fail "the installed command does not run"
fi

echo "== examples/ with find_package(msa)"
args=(-S "$source/examples" -B "$work/examples" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx"
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release)
[[ -n $cuda_bin ]] && args+=(-DCUDAToolkit_ROOT="$(dirname "$cuda_bin")")
cmake "${args[@]}" >"$work/examples_configure.log" || { cat "$work/examples_configure.log"; fail "configure examples/"; }
cmake --build "$work/examples" -j 2
"$work/examples/cpu_decode"
if grep -q "msa_HAS_CUDA ON" "$libdir/cmake/msa/msaConfig.cmake"; then
  for e in gpu_decode_graph gpu_prefill_k2q; do
    [[ -x $work/examples/$e ]] || fail "the CUDA package did not build $e"
  done
  echo "GPU examples built (they run on a GPU machine: scripts/device.sh --examples)"
fi

echo "== cpu_decode with pkg-config"
export PKG_CONFIG_PATH="$(dirname "$pc")"
flags=$(pkg-config --cflags --libs msa)
echo "pkg-config --cflags --libs msa: $flags"
# shellcheck disable=SC2086
"$cxx" -std=c++20 -O2 "$source/examples/cpu_decode.cpp" $flags -o "$work/cpu_decode_pc"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/cpu_decode_pc"

echo "== the library alone needs no CLI11, nlohmann-json or GoogleTest"
cmake -S "$source" -B "$work/library_only" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" -DMSA_CUDA=OFF \
      -DMSA_BUILD_TOOLS=OFF -DMSA_TESTS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON \
      -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
      >"$work/library_only.log" 2>&1 || { cat "$work/library_only.log"; fail "library-only configure"; }
# CMake names the switches it never read: proof that no find_package asked for them.
for p in CLI11 nlohmann_json GTest; do
  grep -q "CMAKE_DISABLE_FIND_PACKAGE_$p\$" "$work/library_only.log" ||
    { cat "$work/library_only.log"; fail "the library-only configure looked for $p"; }
done
echo "test_install: passed"
