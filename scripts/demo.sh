#!/usr/bin/env bash
# The main job on a fresh machine: install, build an n-gram graph from the demo corpus, and
# generate with speculative decoding (embedded mode), compared with plain decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/speculant demo "$@"
