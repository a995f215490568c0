"""The ``speculant bench cost`` command and the cost flags that ``bench generate --cost`` shares."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cost import (
    DEFAULT_CACHE_TOKENS,
    DEFAULT_COST_MODELS,
    DEFAULT_NEW_TOKENS,
    DEFAULT_REPEATS,
    CostSettings,
    format_cost_table,
    run_cost,
)
from bench.cost_projection import FORMULA, format_projection, project_all


def parse_counts(text: str) -> tuple[int, ...]:
    """'1-17,31' -> (1, 2, ..., 17, 31): ranges and single counts, sorted, distinct."""
    counts: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            low, _, high = part.partition("-")
            counts.update(range(int(low), int(high or low) + 1))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad new-token counts {text!r}: {exc}") from exc
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"new-token counts must be >= 1, got {text!r}")
    return tuple(sorted(counts))


def _models(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def add_cost_options(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The cost options; with prefix 'cost-' for `bench generate --cost`."""
    models_help = "comma-separated model folders or names"
    default_models = None if prefix else tuple(str(m) for m in DEFAULT_COST_MODELS)
    p.add_argument(f"--{prefix}models", type=_models, default=default_models, help=models_help)
    p.add_argument(
        f"--{prefix}new-tokens", type=parse_counts, default=DEFAULT_NEW_TOKENS, help="e.g. 1-17,31"
    )
    p.add_argument(f"--{prefix}cache", type=int, default=DEFAULT_CACHE_TOKENS, help="cache tokens")
    p.add_argument(
        f"--{prefix}repeats", type=int, default=DEFAULT_REPEATS, help="timed forwards per figure"
    )
    p.add_argument(
        f"--{prefix}device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto = cuda when available",
    )
    p.add_argument(
        f"--{prefix}dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="the models' dtype",
    )


def cost_settings_from_args(
    args: argparse.Namespace, prefix: str = "", models: Sequence[str] = ()
) -> CostSettings:
    """CostSettings from parsed options (`prefix` as in add_cost_options)."""
    key = prefix.replace("-", "_")
    return CostSettings(
        models=tuple(getattr(args, f"{key}models") or models),
        new_tokens=tuple(getattr(args, f"{key}new_tokens")),
        cache_tokens=getattr(args, f"{key}cache"),
        repeats=getattr(args, f"{key}repeats"),
        torch_threads=args.torch_threads,
        device=getattr(args, f"{key}device"),
        dtype=getattr(args, f"{key}dtype"),
    )


def register_cost(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `speculant bench cost`."""
    p = bench_subparsers.add_parser(
        "cost",
        help="verifier forward cost for 1..n new tokens, and projections from a bench run",
    )
    add_cost_options(p)
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument(
        "--from",
        dest="from_json",
        default=None,
        metavar="BENCH.json",
        help="project the speculative variants of this `bench generate --json` output",
    )
    p.add_argument("--json", default=None, metavar="OUT", help="write every figure here")
    p.set_defaults(handler=run_bench_cost)


def run_bench_cost(args: argparse.Namespace) -> int:
    from speculant.cli_errors import fail
    from speculant.errors import SpeculantError

    settings = cost_settings_from_args(args)
    try:
        cost = run_cost(settings, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except SpeculantError as exc:  # a model that does not load
        return fail(exc)
    result: dict[str, Any] = {"cost": cost}
    print(format_cost_table(cost))
    if args.from_json:
        run = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        rows = project_all(run["summary"], cost, run["settings"].get("model"))
        result.update(projection=rows, projection_formula=FORMULA, source=args.from_json)
        print()
        print(format_projection(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}", file=sys.stderr)
    return 0
