"""Sizes a reader can hold in mind: no hand-written module over MAX_MODULE_LINES lines and no
function over MAX_FUNCTION_LINES lines (from ``def`` to its last line), except argparse
registration functions (``register*``, ``add_*_args`` / ``add_*_arguments``: flat lists of
flags). The generated protobuf code is not hand-written."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.assets import ROOT

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
FOLDERS = (
    "speculant",
    "builder",
    "draft_service",
    "verifier_service",
    "gateway",
    "distill",
    "bench",
    "launcher",
    "scripts",
    "tests",
)
REGISTRATION = re.compile(r"^(register\w*|add_\w+_(args|arguments))$")


def hand_written() -> list[Path]:
    return [
        path
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "v1" not in path.relative_to(ROOT).parts
    ]


def test_the_check_sees_the_sources() -> None:
    assert len(hand_written()) > 200


def test_no_module_is_over_the_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in hand_written()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, "\n".join(long)


def test_no_function_is_over_the_limit() -> None:
    long = []
    for path in hand_written():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and not REGISTRATION.match(node.name):
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)
