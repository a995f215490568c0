"""``speculant bench distill``: tau on held-out prompts against the distillation budget.

The model's continuations of max(budgets) prompts are generated once; for each budget b a copy
of the graph gets the first b of them (in prompt order) appended, as ``speculant distill
--generations b`` would. The model's greedy continuations of the held-out prompts are also
computed once (:func:`distill.replay.prompt_traces`): at temperature 0 speculative decoding
outputs the model's greedy continuation whatever the drafts, so for each budget the rounds of
greedy decoding with the default drafts (``DraftConfig``'s shape, the graph's mixing defaults,
learning off: tau of the graph alone) are replayed against them (:mod:`distill.replay`:
exact, no model call), with every drafted token verified: tau under a flat cost profile, the
figure that carries to a GPU (there a forward over the draft costs about one over a token).

tau = generated tokens / verifier forward passes (the prefill included), per prompt; the table
reports its median over prompts and its value over all tokens, and the acceptance rate, over all
prompts and, when the records have a ``kind``, per kind (records without one under "(none)").
Held-out prompt records are a text ``prompt`` or chat ``messages`` (rendered with the model's
chat template, as the chat route does; :mod:`speculant.prompt_records`). A user picks a budget
from the curve: the time it costs against the tau it buys.

A prompts file that cannot be used ends the command with one error line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.settings import DEMO_PROMPTS, SHARED_DEV_PROMPTS
from distill.generation import Generation
from distill.replay import (
    GreedyTrace,
    SimResult,
    every_8,
    kind_labels,
    kinds_in,
    prompt_traces,
    replayed_drafts,
    simulate,
    verify_all,
)
from distill.run import append_generations, continuations, prepare, sample_weight_default
from speculant.cli_errors import EXIT_USAGE, CommandError
from speculant.config import DraftParams
from speculant.errors import InvalidArgumentError
from speculant.prompt_records import PromptRecord, PromptsError, load_prompts


def eval_prompts(path: str | None, limit: int | None) -> tuple[Path, list[PromptRecord]]:
    """The held-out prompt records: the file given, else the tinystories dev prompts, else the
    demo's; CommandError (one line, exit status 2) for a file that cannot be used."""
    chosen = Path(path) if path else SHARED_DEV_PROMPTS
    if not path and not chosen.is_file():
        chosen = DEMO_PROMPTS
    try:
        return chosen, load_prompts(chosen, limit)
    except PromptsError as exc:
        raise CommandError(f"--eval-prompts: {exc}", EXIT_USAGE) from exc


def default_drafts() -> DraftParams:
    """The draft shape scored: the DraftConfig defaults (mixing: the graph's defaults), every
    drafted token verified; CommandError unless greedy (the replay covers greedy drafts)."""
    from speculant.config import DraftConfig

    params = verify_all(DraftParams.from_config(DraftConfig()))
    if params.strategy != "greedy":
        raise CommandError(
            f"the replay covers greedy drafts only, and the draft strategy is {params.strategy!r} "
            "(SPECULANT_DRAFT__STRATEGY)",
            EXIT_USAGE,
        )
    return params


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def bootstrap_tau(
    counts: Sequence[tuple[int, int]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float]:
    """The percentile bootstrap interval of tau over all tokens, resampling prompts: counts
    holds each prompt's (tokens, forwards); each resample draws len(counts) prompts with
    replacement and its tau is their total tokens / total forwards. (0, 0) for no prompts."""
    if not counts:
        return 0.0, 0.0
    rng = random.Random(seed)
    n = len(counts)
    taus = []
    for _ in range(resamples):
        tokens = forwards = 0
        for _ in range(n):
            t, f = counts[rng.randrange(n)]
            tokens += t
            forwards += f
        taus.append(tokens / forwards if forwards else 0.0)
    taus.sort()
    tail = (1.0 - level) / 2
    low = taus[int(tail * resamples)]
    high = taus[min(resamples - 1, int((1.0 - tail) * resamples))]
    return low, high


def figures(results: Sequence[SimResult]) -> dict[str, Any]:
    """tau median over prompts, tau over all tokens (with its bootstrap 95% interval over
    prompts, :func:`bootstrap_tau`), acceptance and the counts of a set of per-prompt replays."""
    total = SimResult()
    for result in results:
        total.add(result)
    return {
        "prompts": len(results),
        "tau_median": statistics.median(r.tau for r in results) if results else 0.0,
        "tau_all_tokens": total.tau,
        "tau_ci95": list(bootstrap_tau([(r.tokens, r.forwards) for r in results])),
        "acceptance_rate": total.acceptance,
        "tokens": total.tokens,
        "rounds": total.forwards,
        "drafted": total.drafted,
        "accepted": total.accepted,
    }


def measure_tau(
    graph_path: Path,
    traces: Sequence[GreedyTrace],
    labels: Sequence[str],
    params: DraftParams,
    max_tokens: int,
    max_context: int | None,
) -> dict[str, Any]:
    """The replayed rounds of greedy speculative decoding of the traces with drafts from the
    graph alone (no learning): the figures over all prompts, and per kind under "by_kind" when
    labels has kinds."""
    from draft_service.drafting import Drafter
    from speculant.graph_reader import NGramGraph

    started = time.perf_counter()
    graph = NGramGraph.open(graph_path)
    try:
        drafter = Drafter(graph)
        window = graph.window  # the context tokens drafting reads
        results = [
            simulate(drafter, params, trace, max_tokens, window, max_context) for trace in traces
        ]
    finally:
        graph.close()
    row = figures(results)
    row["per_prompt"] = [
        [r.tokens, r.forwards, r.drafted, r.accepted] for r in results
    ]  # tokens, forwards, drafted, accepted of each prompt, in the prompts' order
    kinds = kinds_in(labels)
    if kinds:
        row["by_kind"] = {
            kind: figures([r for r, label in zip(results, labels, strict=True) if label == kind])
            for kind in kinds
        }
    row["seconds"] = time.perf_counter() - started
    return row


def run_bench(args: argparse.Namespace) -> int:
    from distill.cli import options_from_args

    budgets = args.budgets
    options = options_from_args(args, max(max(budgets), 1))
    save_graph = Path(args.save_graph) if getattr(args, "save_graph", None) else None
    if save_graph is not None and save_graph.exists():
        raise CommandError(f"--save-graph {save_graph}: already exists", EXIT_USAGE)
    prompts_path, prompts = eval_prompts(args.eval_prompts, args.limit)
    labels = kind_labels(prompts)
    params = default_drafts()
    job = prepare(options)
    loaded = job.loaded
    started = time.perf_counter()
    progress = every_8(_progress, "greedy continuations of the evaluation prompts")
    try:
        traces = prompt_traces(loaded, prompts, args.eval_max_tokens, progress)
    except InvalidArgumentError as exc:  # a prompt the model cannot take
        raise CommandError(f"--eval-prompts {prompts_path}: {exc}", EXIT_USAGE) from exc
    eval_seconds = time.perf_counter() - started
    started = time.perf_counter()
    # the main continuations in prompt order, then each sample round's (--samples)
    generations: list[Generation] = sorted(continuations(job), key=lambda g: (g.sample, g.index))
    generate_seconds = time.perf_counter() - started
    per_generation = generate_seconds / max(len(job.prompt_ids), 1)  # a prompt's, samples too
    measure = partial(
        measure_tau,
        traces=traces,
        labels=labels,
        params=params,
        max_tokens=args.eval_max_tokens,
        max_context=loaded.max_context,
    )
    rows = budget_rows(
        job,
        generations,
        budgets,
        per_generation,
        measure,
        save_graph,
        lambda budget: [g for g in generations if g.index < budget],  # the first b prompts'
    )
    result = {
        "graph": str(job.graph),
        "model": args.model,
        "eval_prompts": str(prompts_path),
        "prompts": len(prompts),
        "kinds": {kind: labels.count(kind) for kind in kinds_in(labels)},
        "traces": [  # each prompt's label, prompt tokens, greedy tokens, ended by EOS
            [label, len(t.prompt_ids), len(t.tokens), t.ended_by_eos]
            for label, t in zip(labels, traces, strict=True)
        ],
        "eval_max_tokens": args.eval_max_tokens,
        "eval_seconds": eval_seconds,
        "draft": replayed_drafts(params),
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "weight": options.weight,
        "samples": options.samples,  # sampled answers per prompt (budget b: b prompts')
        "sample_temperature": options.sample_temperature,
        "sample_weight": options.sample_weight or sample_weight_default(options.weight),
        "loop_cut": [options.loop_ngram, options.loop_repeats],
        "device": str(loaded.device),
        "generate_seconds": generate_seconds,
        "generations_per_second": len(generations) / max(generate_seconds, 1e-9),
        "generated_tokens": sum(len(g.continuation_ids) for g in generations),
        "rows": rows,
    }
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    if args.plot:
        plot(result, args.plot)
    return 0


def budget_rows(
    job: Any,
    generations: list[Generation],
    budgets: Sequence[int],
    per_generation: float,
    measure: Callable[[Path], dict[str, Any]],
    save_graph: Path | None,
    pick: Callable[[int], Sequence[Generation]] | None = None,
) -> list[dict[str, Any]]:
    """A row per budget b: the figures `measure` gives of a scratch copy of the job's graph
    with the first b generations appended (pick(b) when given: e.g. the first b prompts'
    greedy and sampled ones; budget 0: the graph itself), and the seconds generating them
    would take; the largest budget's graph is copied to save_graph if given."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-distill-") as scratch:
        for budget in budgets:
            graph = job.graph
            if budget > 0:
                graph = Path(scratch) / f"graph-{budget}"
                shutil.copytree(job.graph, graph)
                chosen = pick(budget) if pick is not None else generations[:budget]
                append_generations(job, chosen, graph)
            row = {"generations": budget, "est_generate_seconds": budget * per_generation}
            row |= measure(graph)
            rows.append(row)
            _progress(f"budget {budget}: tau {row['tau_median']:.2f} (median)")
            if save_graph is not None and budget == max(budgets):
                shutil.copytree(graph, save_graph)
                _progress(f"budget {budget}: graph kept at {save_graph}")
            if graph != job.graph:
                shutil.rmtree(graph, ignore_errors=True)
    return rows


def format_table(result: dict[str, Any]) -> str:
    """One line per budget (with kinds: one per budget for all prompts, then one per kind);
    "vs 0": tau over all tokens against the corpus graph's (budget 0, of the same prompts)."""
    draft = result["draft"]
    kinds = list(result.get("kinds") or {})
    lines = [
        f"tau on {result['prompts']} evaluation prompts ({result['eval_prompts']}), "
        f"{result['eval_max_tokens']} tokens, greedy, default drafts (k {draft['k']}, "
        f"{draft['tree_nodes']} tree nodes, overlay weight {draft['overlay_weight']:g}), every "
        "drafted token verified: tau under a flat cost profile, the figure that carries to a GPU "
        "(replayed against the model's greedy continuations)",
        f"distilled with {result['model']} at temperature {result['temperature']}, weight "
        f"{result['weight']}, {result['generations_per_second']:.2f} generations/s "
        f"({result.get('generated_tokens', 0) / max(result['generate_seconds'], 1e-9):.1f} "
        f"tokens/s) on {result['device']}; 95% interval: bootstrap over prompts "
        f"({BOOTSTRAP_RESAMPLES} resamples)",
    ]
    group = f" {'kind':16} {'prompts':>7}" if kinds else ""
    lines.append(
        f"{'generations':>11}{group} {'tau median':>10} {'tau all':>8} {'95% interval':>13} "
        f"{'vs 0':>6} {'accept':>7} {'~seconds':>9}"
    )
    rows = result["rows"]
    first = rows[0] if rows and rows[0]["generations"] == 0 else None
    for row in rows:
        groups = [("all", row, first)]
        groups += [(kind, row["by_kind"][kind], first and first["by_kind"][kind]) for kind in kinds]
        for name, values, zero in groups:
            base = zero["tau_all_tokens"] if zero else 0.0
            ratio = f"{values['tau_all_tokens'] / base:.2f}x" if base else "-"
            cells = f" {name[:16]:16} {values['prompts']:>7}" if kinds else ""
            low, high = values.get("tau_ci95") or (0.0, 0.0)
            lines.append(
                f"{row['generations']:>11,}{cells} {values['tau_median']:>10.2f} "
                f"{values['tau_all_tokens']:>8.2f} {f'{low:.2f}-{high:.2f}':>13} {ratio:>6} "
                f"{values['acceptance_rate']:>7.1%} {row['est_generate_seconds']:>9.1f}"
            )
    return "\n".join(lines)


def plot(result: dict[str, Any], out: str) -> None:
    """tau against the number of distilled generations (matplotlib, Agg); with kinds, also
    each kind's tau over all tokens (dashed)."""
    from bench.plot import require_matplotlib

    plt = require_matplotlib()
    rows = result["rows"]
    xs = [r["generations"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["tau_median"] for r in rows], marker="o", label="median over prompts")
    ax.plot(xs, [r["tau_all_tokens"] for r in rows], marker="s", label="over all tokens")
    for kind in result.get("kinds") or {}:
        ys = [r["by_kind"][kind]["tau_all_tokens"] for r in rows]
        ax.plot(xs, ys, linestyle="--", marker=".", label=f"{kind}: over all tokens")
    ax.set_xlabel("distilled generations")
    ax.set_ylabel("tokens per verifier forward (tau, flat cost)")
    ax.set_title(f"speculant distill: {Path(result['graph']).name}, {result['prompts']} prompts")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
