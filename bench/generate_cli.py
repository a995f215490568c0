"""The `speculant bench generate` command: its flags, their checks, and the run they start."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import cost, cost_projection
from bench.constrained import UNCONSTRAINED_ONLY, check_systems
from bench.cost import add_cost_options, cost_settings_from_args, register_cost
from bench.generate import run_benchmark
from bench.plot import PlotUnavailable, require_matplotlib, write_plot
from bench.report import format_footer, format_table
from bench.round_breakdown import format_round_table
from bench.settings import (
    DEFAULT_DRAFT_K,
    DEFAULT_DRAFT_SIZE,
    DEFAULT_OVERLAY_WEIGHT,
    DEFAULT_TREE_NODES,
    DEFAULT_VERIFY_COST,
    SERVICES_AS,
    SYSTEMS,
    BenchSettings,
    default_prompts_path,
    load_prompts,
    options_from_args,
)
from gateway.launch.cli import add_sampling_arguments
from gateway.launch.commands import check_verify_cost, sampling_options
from speculant.config import DRAFT_SIZES
from speculant.errors import SpeculantError
from speculant.prompt_records import PromptRecord, PromptsError


def _csv(kind: Callable[[str], Any]) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return parse


def _on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError(f"expected on or off, got {text!r}")
    return text == "on"


def _draft_size(text: str) -> str:
    if text not in DRAFT_SIZES:
        raise ValueError(f"unknown draft size {text!r}; choose from {', '.join(DRAFT_SIZES)}")
    return text


def _system(text: str) -> str:
    if text not in SYSTEMS:
        raise ValueError(f"unknown system {text!r}; choose from {', '.join(SYSTEMS)}")
    return text


def register_bench(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `speculant bench generate`."""
    p = bench_subparsers.add_parser(
        "generate",
        help="speculative decoding (embedded, services) against HF generate and prompt lookup",
    )
    p.add_argument(
        "--prompts",
        default=str(default_prompts_path()),
        help="JSON lines: prompt (text) or messages (chat, rendered with the model's chat "
        "template), an optional kind (figures are reported per kind too), and optionally "
        "response_format or tools + tool_choice (generated under that constraint by every "
        "system; see docs/benchmarks.md)",
    )
    p.add_argument("--graph", required=True, help="graph directory")
    p.add_argument("--model", required=True, help="model name or folder")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    add_sampling_arguments(p, logprobs=False)
    p.add_argument("--seed", type=int, default=0, help="prompt i uses seed + i")
    p.add_argument(
        "--k",
        dest="ks",
        type=_csv(int),
        default=(DEFAULT_DRAFT_K,),
        help=f"draft depths to compare, e.g. 4,8 (default {DEFAULT_DRAFT_K}, DraftConfig's)",
    )
    p.add_argument(
        "--mix",
        dest="mixes",
        type=_csv(_on_off),
        default=(True,),
        help="attentive mixing on, off, or on,off (default on)",
    )
    p.add_argument(
        "--strategy", choices=["greedy", "sampling"], default="greedy", help="draft strategy"
    )
    p.add_argument(
        "--systems",
        type=_csv(_system),
        default=SYSTEMS,
        help="subset of " + ",".join(SYSTEMS) + " (default: all; constrained prompts: all but "
        "hf-lookup)",
    )
    p.add_argument("--limit", type=int, default=None, help="first N prompts only")
    p.add_argument("--repetitions", type=int, default=1, help="runs per prompt and variant")
    p.add_argument("--warmup", type=int, default=1, help="prompts run untimed first")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads here and OMP/MKL_NUM_THREADS in the services (default 1: on a "
        "small shared machine a second OpenMP thread slows tiny-model forwards badly)",
    )
    p.add_argument(
        "--device", choices=["cpu", "auto", "cuda"], default="cpu", help="where the model runs"
    )
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="the model's dtype in every system (auto: the checkpoint's on a GPU, float32 on a "
        "CPU)",
    )
    p.add_argument(
        "--tree-nodes",
        type=_csv(int),
        default=(DEFAULT_TREE_NODES,),
        help="draft tree sizes to compare, e.g. 0,12,24 (0 = a chain of k; default "
        f"{DEFAULT_TREE_NODES}, DraftConfig's)",
    )
    p.add_argument(
        "--overlay-weight",
        dest="overlay_weights",
        type=_csv(float),
        default=(DEFAULT_OVERLAY_WEIGHT,),
        help="context overlay weights to compare, e.g. 0,4 (0 = off; default "
        f"{DEFAULT_OVERLAY_WEIGHT:g}, DraftConfig's)",
    )
    p.add_argument(
        "--draft-size",
        dest="draft_sizes",
        type=_csv(_draft_size),
        default=(DEFAULT_DRAFT_SIZE,),
        help="cost (verify the part of each draft that pays), fixed (verify every drafted "
        f"token), or cost,fixed side by side (default {DEFAULT_DRAFT_SIZE})",
    )
    p.add_argument(
        "--verify-cost",
        dest="verify_costs",
        type=_csv(str),
        default=(DEFAULT_VERIFY_COST,),
        metavar="measured|flat|FILE.json,...",
        help="the cost profiles --draft-size cost uses, side by side: measured (the verifier's), "
        "flat (every forward costs the same, as on a GPU), or a `bench cost --json` file "
        f"(default {DEFAULT_VERIFY_COST})",
    )
    p.add_argument(
        "--pin-cpus",
        action="store_true",
        help="run model forwards (this process's hf and embedded runs, the verifier service) "
        "on the first core and the draft service and gateway on the others",
    )
    p.add_argument(
        "--compare-graph",
        dest="compare_graphs",
        action="append",
        default=[],
        metavar="GRAPH_DIR",
        help="also draft from this graph (e.g. a distilled copy of --graph), side by side; "
        "repeatable",
    )
    p.add_argument(
        "--long-context",
        type=int,
        default=0,
        metavar="TOKENS",
        help="every graph drafts from the longest match of up to this many context tokens too "
        "(see serve-draft --long-context; 0 = off)",
    )
    p.add_argument(
        "--learn",
        dest="learns",
        type=_csv(_on_off),
        default=(False,),
        help="online learning: off, on, or off,on side by side (default off); on = a live layer "
        "warmed up on --learn-warmup other generations, paused while measuring",
    )
    p.add_argument(
        "--learn-warmup",
        type=int,
        default=300,
        metavar="N",
        help="generations a learning drafter sees before measuring (default 300)",
    )
    p.add_argument(
        "--learn-warmup-prompts",
        default=None,
        metavar="FILE.jsonl",
        help="their prompts (default: document prefixes of the graph's own corpus)",
    )
    p.add_argument(
        "--learn-restart",
        action="store_true",
        help="services: restart a learning draft service (SIGTERM) after its warm-up, so that "
        "it measures what it replayed from its learn log",
    )
    p.add_argument(
        "--services-as",
        choices=SERVICES_AS,
        default="bench",
        help="how the services start: bench (--torch-threads in every service, --pin-cpus), "
        "up (as `speculant up` starts them with default flags: its thread choice and pinning), "
        "serve (serve-draft, serve-verifier, serve-gateway with default flags, unpinned)",
    )
    p.add_argument("--json", default=None, metavar="OUT", help="write every figure here")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="draw the figures (matplotlib)")
    p.add_argument(
        "--cost",
        action="store_true",
        help="add the forward-cost section and the projected speedups (see `bench cost`); "
        "--cost-models defaults to the run's model and random-llama-58m",
    )
    add_cost_options(p, prefix="cost-")
    p.set_defaults(handler=run_bench_generate)
    register_cost(bench_subparsers)


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """BenchSettings: each field from the flag of its name (sampling: from the sampling flags)."""
    return options_from_args(
        BenchSettings,
        args,
        sampling=sampling_options(args),
        compare_graphs=tuple(args.compare_graphs),
    )


def default_systems(prompts: list[PromptRecord]) -> tuple[str, ...]:
    """Every system, less those that cannot follow a constraint when some prompt has one."""
    if not any(p.constrained for p in prompts):
        return SYSTEMS
    return tuple(s for s in SYSTEMS if s not in UNCONSTRAINED_ONLY)


def _raise_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(143)  # unwinds through the finally blocks that stop the services


def default_cost_models(run_model: str) -> tuple[str, ...]:
    """The run's model, then random-llama-58m from ../shared when it is there."""
    models = [run_model]
    larger = cost.DEFAULT_COST_MODELS[-1]
    if larger.is_dir() and Path(run_model).resolve() != larger.resolve():
        models.append(str(larger))
    return tuple(models)


def add_cost_section(
    result: dict[str, Any], cost_settings: cost.CostSettings, progress: Callable[[str], None]
) -> None:
    """Measure the forward costs and add them, with the projections, to a bench result."""
    costs = cost.run_cost(cost_settings, progress=progress)
    result["cost"] = costs
    result["projection_formula"] = cost_projection.FORMULA
    result["projection"] = cost_projection.project_all(
        result["summary"], costs, result["settings"]["model"]
    )


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench_generate(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from speculant.cli_errors import fail, usage_error

    if not settings.ks or not settings.mixes or not settings.systems:
        return usage_error("--k, --mix and --systems need at least one value")
    if not settings.draft_sizes or not settings.verify_costs:
        return usage_error("--draft-size and --verify-cost need at least one value")
    try:
        prompts = load_prompts(settings.prompts, settings.limit)  # a bad file fails now
        for spec in settings.verify_costs:
            check_verify_cost(spec)
        if args.systems is SYSTEMS:  # the default: every system that can run these prompts
            settings.systems = default_systems(prompts)
        check_systems(settings.systems, prompts)
    except (PromptsError, SpeculantError, ValueError) as exc:
        return usage_error(exc)
    if args.plot:
        try:
            require_matplotlib()  # fail before the run, not after it
        except PlotUnavailable as exc:
            return usage_error(exc)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        result = run_benchmark(settings, progress=_progress)
        if args.cost:
            cost_settings = cost_settings_from_args(
                args, prefix="cost-", models=default_cost_models(settings.model)
            )
            add_cost_section(result, cost_settings, _progress)
    except SpeculantError as exc:  # a graph or a model that does not load, a backend that fails
        return fail(exc)
    print(format_table(result))
    print()
    if rounds := format_round_table(result):
        print(rounds)
        print()
    print(format_footer(result))
    if args.cost:
        print()
        print(cost.format_cost_table(result["cost"]))
        print()
        print(cost_projection.format_projection(result["projection"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {args.json}", file=sys.stderr)
    if args.plot:
        write_plot(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
