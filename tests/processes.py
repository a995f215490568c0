"""Helpers for tests that run services as child processes: free localhost ports, and a
verifier (stories260K) started with ``speculant serve-verifier``."""

from __future__ import annotations

import os
import subprocess
import sys

from speculant.health import wait_until_serving
from tests.assets import STORIES_MODEL


def start_verifier_process(port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "serve-verifier",
            "--model",
            str(STORIES_MODEL),
            "--port",
            str(port),
            "--torch-threads",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert wait_until_serving(f"127.0.0.1:{port}", timeout_s=120), "verifier did not start"
    return process
