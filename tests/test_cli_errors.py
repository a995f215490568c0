"""Every command reports a failure the same way (speculant.cli_errors): one line
``speculant COMMAND: error: ...``, exit status 1 for a failed job and 2 for a wrong command line,
never a traceback or a signal; and the things users expect of a CLI (--version, -v after the
subcommand, a help line and the default for every flag)."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from launcher.cli import all_subparsers, build_parser
from tests.assets import STORIES_MODEL

SPECULANT = [sys.executable, "-m", "launcher.cli"]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPECULANT, *args], capture_output=True, text=True, timeout=timeout)


def error_lines(completed: subprocess.CompletedProcess[str], command: str) -> list[str]:
    """The error lines of stderr, checked to be the convention's and the only traceback-free
    output of their kind."""
    assert "Traceback" not in completed.stderr, completed.stderr
    lines = [line for line in completed.stderr.splitlines() if ": error: " in line]
    assert all(line.startswith(f"speculant {command}: error: ") for line in lines), lines
    return lines


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--graph", "/nonexistent/graph", "--model", str(STORIES_MODEL)], 1, "graph not found"),
        (["--graph", "{graph}", "--model", "/nonexistent/model"], 1, "/nonexistent/model"),
        (["--graph", "{graph}", "--model", str(STORIES_MODEL), "--k", "0"], 2, "--k"),
        (
            ["--graph", "{graph}", "--model", str(STORIES_MODEL), "--temperature", "-1"],
            2,
            "--temperature",
        ),
        (["--model", str(STORIES_MODEL)], 2, "--graph and --model"),
        (
            ["--graph", "{graph}", "--model", str(STORIES_MODEL), "--verify-cost", "/no/c.json"],
            2,
            "--verify-cost: cannot read cost profile /no/c.json",
        ),
        (["--gateway", "127.0.0.1:1"], 1, "gateway 127.0.0.1:1"),
    ],
)
def test_generate_errors_are_one_line(tinystories_graph, args, status, message):
    args = [a.replace("{graph}", str(tinystories_graph)) for a in args]
    completed = run("generate", "--prompt", "Hi", *args)
    assert completed.returncode == status, completed.stderr
    errors = error_lines(completed, "generate")
    assert len(errors) == 1 and message in errors[0], completed.stderr


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("serve-draft", ["--graph", "{graph}"]),
        ("serve-verifier", ["--model", str(STORIES_MODEL), "--device", "cpu"]),
        ("serve-gateway", ["--draft", "127.0.0.1:1", "--verifier", "127.0.0.1:1"]),
    ],
)
def test_a_port_in_use_is_one_line_for_every_service(tinystories_graph, taken_port, command, args):
    args = [a.replace("{graph}", str(tinystories_graph)) for a in args]
    completed = run(command, *args, "--port", str(taken_port))
    assert completed.returncode == 1, completed.stderr
    (line,) = error_lines(completed, command)
    assert f"cannot listen on 127.0.0.1:{taken_port}" in line


def test_graph_info_into_a_closed_pipe_ends_quietly(tinystories_graph):
    """`graph-info --json | head -1`: no BrokenPipeError traceback."""
    info = subprocess.Popen(
        [*SPECULANT, "graph-info", str(tinystories_graph), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert info.stdout is not None and info.stderr is not None
    info.stdout.readline()
    info.stdout.close()  # what `head -1` does after its line
    stderr = info.stderr.read().decode()
    info.wait(timeout=60)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert info.returncode in (0, 141)


def test_version_and_verbose_after_the_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("speculant-graph ")
    for argv in (["-v", "graph-info", "g"], ["graph-info", "g", "-v"], ["graph-info", "-v", "g"]):
        assert build_parser().parse_args(argv).verbose is True, argv
    assert build_parser().parse_args(["graph-info", "g"]).verbose is False


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            yield action


def test_every_flag_has_a_help_line_and_shows_its_default():
    parser = build_parser()
    missing, hidden = [], []
    for child in all_subparsers(parser):
        for action in _options(child):
            flag = f"{child.prog} {action.option_strings[-1]}"
            if not action.help:
                missing.append(flag)
                continue
            formatted = child._get_formatter()._expand_help(action)
            nothing = action.nargs == 0 or action.default in (None, argparse.SUPPRESS, [])
            if not nothing and "default" not in formatted:
                hidden.append(flag)
    assert not missing, f"flags without a help line: {missing}"
    assert not hidden, f"flags whose help does not show the default: {hidden}"
    for child in all_subparsers(parser):  # every help page formats (no stray % in a help string)
        assert "usage:" in child.format_help()
