#!/usr/bin/env bash
# Install the project with its test extras into .venv, then run the default test suite.
# Slow tests (full corpora, every prompt over the services) are separate: scripts/test.sh -m slow
# The tests run on SPECULANT_TEST_WORKERS worker processes (default 2, pytest-xdist; 0: in this
# process, as plain `pytest` does).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/ruff format --check .
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -n "${SPECULANT_TEST_WORKERS:-2}" "$@"
