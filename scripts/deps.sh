#!/usr/bin/env bash
# Installs what the build needs from Debian's packages, once: cmake, ninja, g++,
# GoogleTest, CLI11 and nlohmann-json. Does nothing when they are all present.
set -euo pipefail
pkgs=(cmake ninja-build g++ googletest libgtest-dev libcli11-dev nlohmann-json3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
