"""Command-line subcommands of the gateway package."""

from __future__ import annotations

import argparse


def register(
    subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
) -> None:
    """Add this package's subcommands (and its `speculant bench` targets)."""
