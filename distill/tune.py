"""``speculant tune``: fit a graph's mixing parameters by measured tokens per verifier forward.

    speculant tune --graph G --model M --prompts FILE [--max-prompts 32] [--max-tokens 64]
        [--k 8] [--tree-nodes 12] [--train-fraction 0.5] [--metric tau|acceptance]
        [--json OUT] [--write]

1. The model's greedy continuation of every prompt is computed once (Hugging Face ``generate``,
   :func:`distill.replay.greedy_traces`). A prompt record is a text ``prompt`` or chat
   ``messages`` (rendered with the model's chat template and a generation prompt, as the chat
   route does), with an optional ``kind`` (:mod:`speculant.prompt_records`).
2. The prompts are shuffled (``--seed``) and split: a *train* part (``--train-fraction``) and a
   *held-out* part.
3. Candidate mixing settings are scored on the train part by replaying greedy speculative
   decoding against the continuations (:mod:`distill.replay`: exact rounds, no model
   calls): ``backoff``; ``witten-bell`` over a grid of escape weights, refined around the best;
   ``seed`` by coordinate search over its four weights from the built-in values
   (:func:`search`).
4. The best train score wins (ties: the candidate tried first, the built-in default first of
   all); the table shows every mode's best and the built-in default on both parts, so the
   held-out column says whether the choice carries over to prompts it was not fitted on. When
   the records have kinds, every row's figures are also given per kind (records without one
   under "(none)"): the selection stays on the whole train part (:func:`format_table`).
5. ``--write`` stores the winner in the graph's meta record (``tuned``; atomically, with a new
   manifest, :mod:`builder.meta_update`). Drafters then use it for every mixing parameter a
   request does not set.

Score: ``tau`` = generated tokens / verifier forwards (the prefill included) over the part, or
``acceptance`` = accepted / drafted draft tokens, with every drafted token verified
(``draft_size`` "fixed": tau under a flat cost profile, the figure that carries to a GPU).

A prompts file that cannot be used ends the command with one error line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from distill.replay import (
    GreedyTrace,
    SimResult,
    every_8,
    kind_labels,
    kinds_in,
    prompt_traces,
    replayed_drafts,
    simulate_all,
    verify_all,
)
from speculant.cli_errors import EXIT_USAGE, CommandError, fail
from speculant.config import (
    BUILTIN_TUNABLE_DEFAULTS,
    DEFAULT_DRAFT_K,
    DEFAULT_TREE_NODES,
    DraftParams,
)
from speculant.errors import InvalidArgumentError, SpeculantError
from speculant.prompt_records import PromptRecord, PromptsError, load_prompts

METRICS = ("tau", "acceptance")


@dataclass
class TuneOptions:
    """What to tune on; every field is recorded in the JSON output and the graph's meta."""

    graph: str
    model: str
    prompts: str
    max_prompts: int = 32
    max_tokens: int = 64
    k: int = DEFAULT_DRAFT_K
    tree_nodes: int = DEFAULT_TREE_NODES  # the draft shape scored (0 = a chain of k)
    train_fraction: float = 0.5
    metric: str = "tau"
    seed: int = 0
    device: str = "cpu"
    torch_threads: int = 1

    def validate(self) -> TuneOptions:
        """InvalidArgumentError naming the first bad option."""
        if self.max_prompts < 2:
            raise InvalidArgumentError("--max-prompts", f"must be >= 2, got {self.max_prompts}")
        if self.max_tokens < 1:
            raise InvalidArgumentError("--max-tokens", f"must be >= 1, got {self.max_tokens}")
        if not 0.0 < self.train_fraction < 1.0:
            raise InvalidArgumentError(
                "--train-fraction", f"must be in (0, 1), got {self.train_fraction}"
            )
        if self.metric not in METRICS:
            raise InvalidArgumentError("--metric", f"must be one of {METRICS}, got {self.metric}")
        DraftParams(k=self.k, tree_nodes=self.tree_nodes).validate()
        return self


def load_prompt_file(path: str | Path, limit: int) -> list[PromptRecord]:
    """The first `limit` prompt records of a JSON-lines file (a text "prompt" or chat
    "messages", an optional "kind"; :mod:`speculant.prompt_records`).

    CommandError (one line naming the file and line, exit status 2) for a bad file, or one with
    fewer than two prompts (a train and a held-out part need one each).
    """
    try:
        prompts = load_prompts(path, limit)
    except PromptsError as exc:
        raise CommandError(f"--prompts: {exc}", EXIT_USAGE) from exc
    if len(prompts) < 2:
        raise CommandError(
            f"--prompts: {path} has {len(prompts)} prompt(s); tuning needs at least 2", EXIT_USAGE
        )
    return prompts


def split(items: list[Any], train_fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """(train, held-out): a seeded shuffle, the first round(n * fraction) (at least one, at most
    n - 1) for training."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    cut = min(len(items) - 1, max(1, round(len(items) * train_fraction)))
    return [items[i] for i in order[:cut]], [items[i] for i in order[cut:]]


def load_model(options: TuneOptions) -> tuple[Any, Any]:
    """(the graph, opened; the model: verifier_service.model.LoadedModel), their tokenizers
    checked to match (FailedPreconditionError / ModelLoadError with one line)."""
    from gateway.engine import check_tokenizer_alignment
    from speculant.config import VerifierConfig
    from speculant.graph_reader import NGramGraph
    from speculant.tokenizer import tokenizer_fingerprint
    from verifier_service.model import LoadedModel

    graph = NGramGraph.open(options.graph)
    try:
        loaded = LoadedModel.load(
            VerifierConfig(
                model_name=options.model,
                device=options.device,
                torch_threads=options.torch_threads,
            )
        )
        meta = graph.meta
        check_tokenizer_alignment(
            meta.tokenizer_name,
            meta.tokenizer_fingerprint,
            loaded.name,
            tokenizer_fingerprint(loaded.tokenizer),
        )
    except BaseException:
        graph.close()
        raise
    return graph, loaded


def run_tune(options: TuneOptions, progress: Callable[[str], None] | None = None) -> dict:
    """Continuations, split, search, held-out scores: the result (see the module)."""
    options.validate()
    say = progress or (lambda _msg: None)
    prompts = load_prompt_file(options.prompts, options.max_prompts)
    started = time.perf_counter()
    graph, loaded = load_model(options)
    try:
        try:
            traces = prompt_traces(
                loaded, prompts, options.max_tokens, every_8(say, "greedy continuations")
            )
        except InvalidArgumentError as exc:  # a prompt the model cannot take
            raise CommandError(f"--prompts {options.prompts}: {exc}", EXIT_USAGE) from exc
        return _tune(options, graph, loaded, prompts, traces, started, say)
    finally:
        graph.close()


def _parts(
    traces: list[GreedyTrace], labels: list[str], train_fraction: float, seed: int
) -> tuple[list[GreedyTrace], list[GreedyTrace], dict[str, dict[str, list[GreedyTrace]]]]:
    """(train, held-out, by kind: the train and held-out traces of each kind) of a seeded
    split."""
    train_at, heldout_at = split(list(range(len(traces))), train_fraction, seed)
    by_kind = {
        kind: {
            "train": [traces[i] for i in train_at if labels[i] == kind],
            "heldout": [traces[i] for i in heldout_at if labels[i] == kind],
        }
        for kind in kinds_in(labels)
    }
    return [traces[i] for i in train_at], [traces[i] for i in heldout_at], by_kind


def _rows(
    best: dict[str, DraftParams],
    winner: DraftParams,
    scorer: Scorer,
    held: Scorer,
    simulate: Callable[[DraftParams, list[GreedyTrace]], SimResult],
    by_kind: dict[str, dict[str, list[GreedyTrace]]],
) -> list[dict[str, Any]]:
    """A row per mode's best (and the built-in default): its train and held-out figures, and
    with kinds each kind's; the winner's first row is marked chosen (the default's, when it
    won)."""
    rows = []
    marked = False
    for name, params in best.items():
        held(params)
        chosen = params == winner and not marked
        marked = marked or chosen
        row = {
            "name": name,
            "params": mixing_of(params),
            "describe": describe(params),
            "chosen": chosen,
            "train": scorer.results[params].as_dict(),
            "heldout": held.results[params].as_dict(),
        }
        if by_kind:
            row["by_kind"] = {
                kind: {part: simulate(params, ts).as_dict() for part, ts in parts.items()}
                for kind, parts in by_kind.items()
            }
        rows.append(row)
    return rows


def _tune(
    options: TuneOptions,
    graph: Any,
    loaded: Any,
    prompts: list[PromptRecord],
    traces: list[GreedyTrace],
    started: float,
    say: Callable[[str], None],
) -> dict:
    from draft_service.drafting import Drafter

    drafter = Drafter(graph)
    window = graph.window  # the context tokens drafting reads
    max_context = loaded.max_context

    def simulate(params: DraftParams, part: list[GreedyTrace]) -> SimResult:
        return simulate_all(drafter, params, part, options.max_tokens, window, max_context)

    labels = kind_labels(prompts)
    train, heldout, by_kind = _parts(traces, labels, options.train_fraction, options.seed)
    scorer = Scorer(simulate, train, options.metric)
    shape = DraftParams(k=options.k, tree_nodes=options.tree_nodes)
    best = search(scorer, shape, say)
    winner = best_of(scorer, best.values())  # ties: the first in the table, the default first
    held = Scorer(simulate, heldout, options.metric)
    rows = _rows(best, winner, scorer, held, simulate, by_kind)
    return {
        "settings": asdict(options),
        "prompts": {"train": len(train), "heldout": len(heldout)},
        "kinds": {
            kind: {part: len(ts) for part, ts in parts.items()} for kind, parts in by_kind.items()
        },
        "draft": replayed_drafts(shape),
        "metric": options.metric,
        "candidates_tried": len(scorer.order),
        "seconds": time.perf_counter() - started,
        "graph_tuned_before": graph.draft_defaults,
        "rows": rows,
        "candidates": [
            {"describe": describe(params), "train": scorer.results[params].as_dict()}
            for params in scorer.order
        ],
        "best": mixing_of(winner),
    }


# -- the candidate search: which mixing settings are tried, scored by replay --
# A candidate is a DraftParams with every mixing parameter set explicitly (the built-in defaults
# where it does not choose), of the draft shape scored.

ESCAPE_WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
SEED_GRID: dict[str, tuple[float, ...]] = {
    "order_bias": (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
    "reliability_weight": (0.0, 0.25, 0.5, 1.0, 2.0),
    "entropy_penalty": (0.0, 0.25, 0.5, 1.0, 2.0),
    "mix_temperature": (0.25, 0.5, 1.0, 2.0, 4.0),
}
SEED_PASSES = 2


def explicit_params(shape: DraftParams, **mixing: Any) -> DraftParams:
    """Greedy DraftParams of shape's k, tree_nodes and overlay_weight with every mixing
    parameter set (the built-in defaults overridden by `mixing`), every drafted token verified
    (the replay's draft size)."""
    return verify_all(
        DraftParams(
            k=shape.k,
            tree_nodes=shape.tree_nodes,
            overlay_weight=shape.overlay_weight,
            **(BUILTIN_TUNABLE_DEFAULTS | mixing),
        )
    ).validate()


def mixing_of(params: DraftParams) -> dict[str, Any]:
    """The mixing parameters that matter for params' mode (the others are left out)."""
    mode = params.effective_mixing
    if mode == "witten-bell":
        return {"mixing": mode, "escape_weight": params.escape_weight}
    if mode == "seed":
        return {"mixing": mode} | {name: getattr(params, name) for name in SEED_GRID}
    return {"mixing": mode}


_SHORT_NAMES = {
    "escape_weight": "b",
    "order_bias": "ob",
    "reliability_weight": "rw",
    "entropy_penalty": "ep",
    "mix_temperature": "t",
}


def describe(params: DraftParams) -> str:
    """A short name of a candidate: its mode and parameters."""
    values = mixing_of(params)
    mode = values.pop("mixing")
    return " ".join([mode, *(f"{_SHORT_NAMES[k]}={v:g}" for k, v in values.items())])


class Scorer:
    """Scores candidates on a set of traces (cached by parameters)."""

    def __init__(
        self,
        simulate: Callable[[DraftParams, list[GreedyTrace]], SimResult],
        traces: list[GreedyTrace],
        metric: str,
    ) -> None:
        self._simulate = simulate
        self.traces = traces
        self.metric = metric
        self.results: dict[DraftParams, SimResult] = {}
        self.order: list[DraftParams] = []  # in the order tried

    def __call__(self, params: DraftParams) -> float:
        if params not in self.results:
            self.results[params] = self._simulate(params, self.traces)
            self.order.append(params)
        return self.score(self.results[params])

    def score(self, result: SimResult) -> float:
        return result.tau if self.metric == "tau" else result.acceptance


def best_of(scorer: Scorer, candidates: Iterable[DraftParams]) -> DraftParams:
    """The candidate of the highest score (ties: the first)."""
    best: DraftParams | None = None
    for params in candidates:
        if best is None or scorer(params) > scorer(best):
            best = params
    assert best is not None
    return best


def search(
    scorer: Scorer, shape: DraftParams, progress: Callable[[str], None]
) -> dict[str, DraftParams]:
    """The best candidate of every mode on the scorer's traces, keyed by mode, "default" (the
    built-in settings, tried first) and "seed built-in" (the seed formula's built-in weights);
    shape: the draft shape scored (its k and tree_nodes)."""
    default = explicit_params(shape)
    scorer(default)
    best: dict[str, DraftParams] = {"default": default}
    best["backoff"] = explicit_params(shape, mixing="backoff")
    progress(f"backoff: {scorer(best['backoff']):.3f}")
    grid = [explicit_params(shape, escape_weight=b) for b in ESCAPE_WEIGHTS]
    wb = best_of(scorer, [default, *grid])
    b = wb.escape_weight or 1.0
    wb = best_of(scorer, [wb, *(explicit_params(shape, escape_weight=b * f) for f in (0.7, 1.4))])
    best["witten-bell"] = wb
    progress(f"witten-bell: {describe(wb)}: {scorer(wb):.3f}")
    seed = best["seed built-in"] = explicit_params(shape, mixing="seed")
    for _ in range(SEED_PASSES):
        start = seed
        for name, values in SEED_GRID.items():
            seed = best_of(scorer, [seed, *(replace(seed, **{name: v}) for v in values)])
        if seed == start:
            break
    best["seed"] = seed
    progress(f"seed: {describe(seed)}: {scorer(seed):.3f}")
    return best


# -- what is shown and stored of the result --


def tuned_record(result: dict) -> dict[str, Any]:
    """What --write stores as the graph's meta ``tuned``."""
    chosen = next(row for row in result["rows"] if row["chosen"])
    default = next(row for row in result["rows"] if row["name"] == "default")
    settings = result["settings"]
    return {
        "params": dict(result["best"]),
        "metric": result["metric"],
        "train": chosen["train"][result["metric"]],
        "heldout": chosen["heldout"][result["metric"]],
        "default_heldout": default["heldout"][result["metric"]],
        "prompts_file": str(Path(settings["prompts"]).resolve()),
        "train_prompts": result["prompts"]["train"],
        "heldout_prompts": result["prompts"]["heldout"],
        "model": settings["model"],
        "k": settings["k"],
        "max_tokens": settings["max_tokens"],
        "tuned_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_tuned(graph: str | Path, result: dict) -> dict[str, Any]:
    """Store the result's winner in the graph's meta (atomically); the record written."""
    from builder.meta_update import update_meta

    record = tuned_record(result)
    update_meta(graph, lambda meta: replace(meta, tuned=record))
    return record


def format_table(result: dict) -> str:
    """One line per mode's best (and the built-in default): train and held-out figures."""
    metric = result["metric"]
    header = (
        f"{'':2}{'setting':44} {'train ' + metric:>12} {'held-out ' + metric:>15} "
        f"{'held-out acc':>12} {'wasted':>7}"
    )
    lines = [header, "-" * len(header)]
    for row in result["rows"]:
        mark = "* " if row["chosen"] else "  "
        labelled = row["name"] in ("default", "seed built-in")
        name = f"{row['name']}: {row['describe']}" if labelled else row["describe"]
        held = row["heldout"]
        lines.append(
            f"{mark}{name:44} {row['train'][metric]:12.3f} {held[metric]:15.3f} "
            f"{held['acceptance']:12.1%} {held['wasted']:7d}"
        )
    p = result["prompts"]
    lines.append(
        f"(* chosen on {p['train']} train prompts; held-out: {p['heldout']} prompts; "
        f"{result['candidates_tried']} candidates, {result['seconds']:.1f} s; every drafted "
        "token verified: tau under a flat cost profile)"
    )
    if result.get("kinds"):
        lines += ["", *format_kinds(result)]
    return "\n".join(lines)


def format_kinds(result: dict) -> list[str]:
    """Per kind: the prompts and the built-in default's and the chosen setting's train /
    held-out score."""
    metric = result["metric"]
    default = next(row for row in result["rows"] if row["name"] == "default")
    chosen = next(row for row in result["rows"] if row["chosen"])
    shown = [default] if chosen is default else [default, chosen]
    names = ["default", *([f"* {chosen['describe']}"] if chosen is not default else [])]
    names = [name if len(name) <= 24 else name[:21] + "..." for name in names]
    header = f"  {'kind':16} {'prompts':>9}" + "".join(f"   {name:>24}" for name in names)
    lines = [f"per kind, {metric} (train / held-out):", header]
    for kind, counts in result["kinds"].items():
        cells = []
        for row in shown:
            figures = row["by_kind"][kind]
            values = [
                f"{figures[part][metric]:.3f}" if counts[part] else "-"
                for part in ("train", "heldout")
            ]
            cells.append(f"   {' / '.join(values):>24}")
        count = f"{counts['train']} / {counts['heldout']}"
        lines.append(f"  {kind[:16]:16} {count:>9}" + "".join(cells))
    return lines


def print_progress(message: str) -> None:
    """Progress lines go to stderr (stdout holds the table)."""
    print(f"tune: {message}", file=sys.stderr, flush=True)


# -- the command line --


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``speculant tune``."""
    tune = subparsers.add_parser(
        "tune",
        help="fit the graph's mixing parameters by measured tokens per verifier forward on "
        "prompts; --write stores them in the graph as its drafting defaults",
    )
    tune.add_argument("--graph", required=True, help="graph directory")
    tune.add_argument("--model", required=True, help="the verifier model (name or folder)")
    tune.add_argument(
        "--prompts",
        required=True,
        help="JSON lines: prompt (text) or messages (chat, the model's chat template), and an "
        "optional kind (figures per kind)",
    )
    tune.add_argument("--max-prompts", type=int, default=32, help="prompts read (train + held out)")
    tune.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    tune.add_argument(
        "--k", type=int, default=DEFAULT_DRAFT_K, help="draft tokens per round (a tree's depth)"
    )
    tune.add_argument(
        "--tree-nodes",
        type=int,
        default=DEFAULT_TREE_NODES,
        help=f"the draft tree's size scored (0 = a chain of k; default {DEFAULT_TREE_NODES})",
    )
    tune.add_argument(
        "--train-fraction", type=float, default=0.5, help="share of prompts fitted on"
    )
    tune.add_argument(
        "--metric",
        choices=["tau", "acceptance"],
        default="tau",
        help="what is maximised: tokens per verifier forward, or the acceptance rate",
    )
    tune.add_argument("--seed", type=int, default=0, help="seed of the train/held-out split")
    tune.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs"
    )
    tune.add_argument("--json", default=None, metavar="OUT", help="write the result as JSON")
    tune.add_argument(
        "--write",
        action="store_true",
        help="store the best parameters in the graph's meta (atomically, new manifest)",
    )
    tune.set_defaults(handler=run_tune_command)


def run_tune_command(args: argparse.Namespace) -> int:
    """Tune, print the table (and JSON), and with --write store the winner in the graph."""
    options = TuneOptions(
        **{f.name: getattr(args, f.name) for f in fields(TuneOptions) if hasattr(args, f.name)}
    )
    try:
        result = run_tune(options, print_progress)
        print(format_table(result))
        if args.write:
            result["written"] = write_tuned(args.graph, result)
            print(f"wrote the tuned parameters {result['written']['params']} to {args.graph}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    except (SpeculantError, OSError) as exc:
        return fail(str(exc))
    return 0
