#!/usr/bin/env bash
# A virtual environment for the Python package's tests and example, with their
# pinned dependencies from PyPI (numpy, pytest, torch):
#   bash scripts/python_env.sh [DIR]     (default: build-venv)
# then `DIR/bin/pip install .` builds and installs msa into it. A Debian python3
# without venv support or C headers gets python3-venv and python3-dev first.
set -euo pipefail
dir=${1:-build-venv}
py=${PYTHON:-python3}
has_headers='import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
if ! "$py" -c "import ensurepip, venv" 2>/dev/null || ! "$py" -c "$has_headers"; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3-venv python3-dev
fi
[[ -x "$dir/bin/python" ]] || "$py" -m venv "$dir"
"$dir/bin/pip" install -q numpy==2.4.6 pytest==9.2.0 torch==2.11.0
