"""Sizes a reader can hold in mind, as a budget that asks for a reason: a hand-written module
over MODULE_BUDGET lines, or a function over FUNCTION_BUDGET lines (from ``def`` to its last
line), says why in its docstring, in a paragraph that starts with REASON ("Why so long: ...":
one job that does not split well, a flat table). argparse registration functions (``register*``,
``add_*_args`` / ``add_*_arguments``: flat lists of flags) need none. Rooms are cut by their
jobs, not by a count: the budget only makes a long one explain itself. The generated protobuf
code is not hand-written."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.assets import ROOT

MODULE_BUDGET = 600
FUNCTION_BUDGET = 80
REASON = "Why so long:"
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


def explains_itself(node: ast.AST) -> bool:
    """Whether a module's or function's docstring gives the reason for its length."""
    docstring = ast.get_docstring(node) or ""  # type: ignore[arg-type]
    return any(part.strip().startswith(REASON) for part in docstring.split("\n\n"))


def test_a_module_over_the_budget_says_why() -> None:
    long = []
    for path in hand_written():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MODULE_BUDGET and not explains_itself(ast.parse(text)):
            long.append(f"{path.relative_to(ROOT)}: {lines} lines, no '{REASON}' paragraph")
    assert not long, "\n".join(long)


def test_a_function_over_the_budget_says_why() -> None:
    long = []
    for path in hand_written():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            if (
                lines > FUNCTION_BUDGET
                and not REGISTRATION.match(node.name)
                and not explains_itself(node)
            ):
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)


def test_the_reason_is_found_where_it_is_given() -> None:
    """The check is not blind: a long function with the reason passes, without it fails."""
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_BUDGET))
    with_reason = ast.parse(f'def f():\n    """Does f.\n\n    {REASON} a table."""\n{body}\n')
    without = ast.parse(f'def f():\n    """Does f."""\n{body}\n')
    assert explains_itself(with_reason.body[0]) and not explains_itself(without.body[0])
