#!/usr/bin/env bash
# Create (or reuse) .venv and install the project with the pinned constraints.
# Usage: scripts/setup.sh [EXTRA]   e.g. scripts/setup.sh dev   (installs .[dev])
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
target="."
[ -n "$extra" ] && target=".[${extra}]"
# constraints.txt pins torch to the CPU wheel of this project's machines (a plain `torch`
# requirement would pull a multi-GB CUDA build) and the protobuf stub generator.
.venv/bin/python -m pip install --quiet -c constraints.txt -e "$target"
