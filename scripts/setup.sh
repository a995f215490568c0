#!/usr/bin/env bash
# Create (or reuse) .venv and install the project with the pinned constraints.
# Usage: scripts/setup.sh [EXTRA]   e.g. scripts/setup.sh dev   (installs .[dev])
# Quiet: pip's output goes to .venv/install.log, and is shown only when the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
target="."
[ -n "$extra" ] && target=".[${extra}]"
log=.venv/install.log
echo "installing speculant-graph${extra:+[$extra]} into .venv (log: $log)" >&2
# constraints.txt pins torch to the CPU wheel of this project's machines (a plain `torch`
# requirement would pull a multi-GB CUDA build) and the protobuf stub generator.
if ! { .venv/bin/python -m pip install --upgrade pip \
       && .venv/bin/python -m pip install -c constraints.txt -e "$target"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "scripts/setup.sh: error: the install failed (the whole log: $log)" >&2
  exit 1
fi
