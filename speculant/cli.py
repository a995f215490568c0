"""The ``speculant`` command line: one entry point, one subcommand per job.

Each package registers its own subcommands (``register(subparsers)`` in its ``cli`` module), and
handlers import heavy libraries (torch, transformers) only when they run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from builder import cli as builder_cli
from distill import cli as distill_cli
from draft_service import cli as draft_cli
from gateway import cli as gateway_cli
from speculant.request_context import configure_logging
from verifier_service import cli as verifier_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speculant",
        description="Speculative decoding that drafts from a corpus n-gram graph.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = subparsers.add_parser("bench", help="benchmarks (print figures; --json writes them)")
    bench_subparsers = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    for module in (builder_cli, distill_cli, draft_cli, verifier_cli, gateway_cli):
        module.register(subparsers, bench_subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(
        logging.DEBUG if args.verbose else logging.INFO, getattr(args, "log_format", "text")
    )
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
