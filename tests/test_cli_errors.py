"""Mistakes on the command line get one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import STORIES_MODEL


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--graph", "/nonexistent/graph", "--model", str(STORIES_MODEL)], "graph not found"),
        (["--graph", "{graph}", "--model", "/nonexistent/model"], "/nonexistent/model"),
        (["--graph", "{graph}", "--model", str(STORIES_MODEL), "--k", "0"], "--k"),
        (
            ["--graph", "{graph}", "--model", str(STORIES_MODEL), "--temperature", "-1"],
            "--temperature",
        ),
        (["--model", str(STORIES_MODEL)], "--graph and --model"),
        (["--gateway", "127.0.0.1:1"], "gateway 127.0.0.1:1"),
    ],
)
def test_generate_errors_are_one_line(tinystories_graph, args, message):
    args = [a.replace("{graph}", str(tinystories_graph)) for a in args]
    completed = subprocess.run(
        [sys.executable, "-m", "speculant.cli", "generate", "--prompt", "Hi", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode != 0
    assert "Traceback" not in completed.stderr
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], completed.stderr
