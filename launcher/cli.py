"""The ``speculant`` command line: one entry point, one subcommand per job.

Each package registers its own subcommands (``register(subparsers)`` in its ``cli`` module), and
handlers import heavy libraries (torch, transformers) only when they run. Every command reports
a failure the same way (see :mod:`speculant.cli_errors`); ``--help`` shows each flag's default,
``--version`` the package version, and ``-v`` (debug logging) goes before or after the
subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from speculant.cli_errors import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    CommandError,
    fail,
    set_program,
)
from speculant.request_context import configure_logging


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to a flag's help unless the help already speaks of its default,
    or the default is nothing to show (None, False, a suppressed value)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or action.nargs == 0  # a switch: its presence is the value
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or default == []
            or not action.option_strings
        ):
            return text
        if isinstance(default, list | tuple):
            default = ",".join(str(d) for d in default)
        shown = str(default)
        if any(c.isspace() and c != " " for c in shown):
            shown = repr(shown)  # "\n\n\n", not three blank lines
        shown = shown.replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"(default: {shown})"


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("speculant-graph")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def all_subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below `parser` (the subcommands, and `bench`'s targets)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += [child, *all_subparsers(child)]
    return found


# Commands whose start-up time matters, and the one module that registers each: run alone,
# such a command's parser is built without importing the other packages' command modules
# (serve-draft: about 0.2 s less to SERVING, docs/benchmarks.md).
_ALONE = {"serve-draft": "draft_service.cli"}


def _alone(argv: Sequence[str]) -> str | None:
    """The module registering the command of argv when it is one of _ALONE, else None."""
    command = next((word for word in argv if not word.startswith("-")), "")
    return _ALONE.get(command)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The command line's parser: every command, or only that of argv (the arguments to be
    parsed) when it is one of _ALONE."""
    parser = argparse.ArgumentParser(
        prog="speculant",
        description="Speculative decoding that drafts from a corpus n-gram graph.",
        formatter_class=DefaultsHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--version", action="version", version=f"speculant-graph {package_version()}"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    alone = _alone(argv)
    if alone is not None:
        importlib.import_module(alone).register(subparsers)
        return _finish(parser)
    bench = subparsers.add_parser("bench", help="benchmarks (print figures; --json writes them)")
    bench_subparsers = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    # The root CLI is the one module that imports every package (here, lazily).
    from bench import cli as bench_cli
    from builder import cli as builder_cli
    from distill import cli as distill_cli
    from distill import tune as distill_tune
    from draft_service import cli as draft_cli
    from gateway.launch import cli as gateway_cli
    from gateway.launch.up import register_up
    from launcher.demo import register_demo
    from verifier_service import cli as verifier_cli

    for module in (builder_cli, distill_cli, draft_cli, verifier_cli, gateway_cli):
        module.register(subparsers)
    register_up(subparsers)
    register_demo(subparsers)
    distill_tune.register(subparsers)
    bench_cli.register(subparsers, bench_subparsers)
    return _finish(parser)


def _finish(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every subcommand the defaults-showing help and a -v of its own."""
    for child in all_subparsers(parser):
        child.formatter_class = DefaultsHelpFormatter
        if not any("-v" in a.option_strings for a in child._actions):
            # -v after the subcommand too; SUPPRESS keeps a -v given before it
            child.add_argument(
                "-v",
                "--verbose",
                action="store_true",
                default=argparse.SUPPRESS,
                help="debug logging",
            )
    return parser


def _program_name(args: argparse.Namespace) -> str:
    words = ["speculant", args.command]
    if getattr(args, "bench_command", None):
        words.append(args.bench_command)
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    set_program(_program_name(args))
    configure_logging(
        logging.DEBUG if args.verbose else logging.INFO, getattr(args, "log_format", "text")
    )
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except CommandError as exc:
        return fail(exc, exc.code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`speculant graph-info --json | head`): stop quietly, and point
        # stdout at /dev/null so that the interpreter's final flush does not complain.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
