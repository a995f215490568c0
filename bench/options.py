"""Benchmark options from parsed command-line flags: a benchmark's options dataclass names its
fields after the flags that set them."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")


def options_from_args(options: type[T], args: argparse.Namespace, **given: object) -> T:
    """A benchmark's options dataclass: each field from the flag of its name (json_out from
    --json), unless given; a field without a flag keeps its default."""
    values = dict(given)
    for field in fields(options):  # type: ignore[arg-type]
        flag = "json" if field.name == "json_out" else field.name
        if field.name not in values and hasattr(args, flag):
            values[field.name] = getattr(args, flag)
    return options(**values)
