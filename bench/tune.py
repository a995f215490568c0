"""``speculant tune``: fit a graph's mixing parameters by measured tokens per verifier forward.

    speculant tune --graph G --model M --prompts FILE [--max-prompts 32] [--max-tokens 64]
        [--k 8] [--tree-nodes 12] [--train-fraction 0.5] [--metric tau|acceptance]
        [--json OUT] [--write]

1. The model's greedy continuation of every prompt is computed once (Hugging Face ``generate``,
   the benchmark's baseline, :class:`bench.in_process.InProcessSystems`).
2. The prompts are shuffled (``--seed``) and split: a *train* part (``--train-fraction``) and a
   *held-out* part.
3. Candidate mixing settings are scored on the train part by replaying greedy speculative
   decoding against the continuations (:mod:`bench.greedy_sim`: exact rounds, no model
   calls): ``backoff``; ``witten-bell`` over a grid of escape weights, refined around the best;
   ``seed`` by coordinate search over its four weights from the built-in values.
4. The best train score wins (ties: the candidate tried first, the built-in default first of
   all); the table shows every mode's best and the built-in default on both parts, so the
   held-out column says whether the choice carries over to prompts it was not fitted on.
5. ``--write`` stores the winner in the graph's meta record (``tuned``; atomically, with a new
   manifest, :mod:`builder.meta_update`). Drafters then use it for every mixing parameter a
   request does not set.

Score: ``tau`` = generated tokens / verifier forwards (the prefill included) over the part, or
``acceptance`` = accepted / drafted draft tokens.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.greedy_sim import GreedyTrace, SimResult, simulate_all
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES
from speculant.errors import InvalidArgumentError
from speculant.types import BUILTIN_TUNABLE_DEFAULTS, DraftParams

METRICS = ("tau", "acceptance")
ESCAPE_WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
SEED_GRID: dict[str, tuple[float, ...]] = {
    "order_bias": (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
    "reliability_weight": (0.0, 0.25, 0.5, 1.0, 2.0),
    "entropy_penalty": (0.0, 0.25, 0.5, 1.0, 2.0),
    "mix_temperature": (0.25, 0.5, 1.0, 2.0, 4.0),
}
SEED_PASSES = 2


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


def load_prompt_file(path: str | Path, limit: int) -> list[str]:
    """The first `limit` prompts of a JSON-lines file (one object a line, a string "prompt").

    InvalidArgumentError naming the file and line for anything else, or when it has fewer
    than two prompts (a train and a held-out part need one each).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError("--prompts", f"cannot read {path}: {exc}") from exc
    prompts: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InvalidArgumentError("--prompts", f"{path} line {number}: {exc}") from exc
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise InvalidArgumentError(
                "--prompts", f'{path} line {number}: needs a non-empty string field "prompt"'
            )
        prompts.append(prompt)
        if len(prompts) >= limit:
            break
    if len(prompts) < 2:
        raise InvalidArgumentError(
            "--prompts", f"{path} has {len(prompts)} prompt(s); tuning needs at least 2"
        )
    return prompts


def split(items: list[Any], train_fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """(train, held-out): a seeded shuffle, the first round(n * fraction) (at least one, at most
    n - 1) for training."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    cut = min(len(items) - 1, max(1, round(len(items) * train_fraction)))
    return [items[i] for i in order[:cut]], [items[i] for i in order[cut:]]


def explicit_params(shape: DraftParams, **mixing: Any) -> DraftParams:
    """Greedy DraftParams of shape's k and tree_nodes with every mixing parameter set: the
    built-in defaults overridden by `mixing`."""
    return DraftParams(
        k=shape.k, tree_nodes=shape.tree_nodes, **(BUILTIN_TUNABLE_DEFAULTS | mixing)
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


def _best(scorer: Scorer, candidates: Iterable[DraftParams]) -> DraftParams:
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
    wb = _best(scorer, [default, *grid])
    b = wb.escape_weight or 1.0
    wb = _best(scorer, [wb, *(explicit_params(shape, escape_weight=b * f) for f in (0.7, 1.4))])
    best["witten-bell"] = wb
    progress(f"witten-bell: {describe(wb)}: {scorer(wb):.3f}")
    seed = best["seed built-in"] = explicit_params(shape, mixing="seed")
    for _ in range(SEED_PASSES):
        start = seed
        for name, values in SEED_GRID.items():
            seed = _best(scorer, [seed, *(replace(seed, **{name: v}) for v in values)])
        if seed == start:
            break
    best["seed"] = seed
    progress(f"seed: {describe(seed)}: {scorer(seed):.3f}")
    return best


def greedy_traces(
    options: TuneOptions, prompts: list[str], progress: Callable[[str], None]
) -> tuple[Any, list[GreedyTrace]]:
    """(the in-process systems: graph, model, tokenizer; each prompt's greedy trace)."""
    from bench.in_process import InProcessSystems
    from bench.settings import BenchSettings, Variant

    settings = BenchSettings(
        graph=options.graph,
        model=options.model,
        prompts=options.prompts,
        max_tokens=options.max_tokens,
        temperature=0.0,
        systems=("hf", "embedded"),
        device=options.device,
        torch_threads=options.torch_threads,
    )
    import torch

    torch.set_num_threads(options.torch_threads)
    systems = InProcessSystems(settings)
    traces = []
    for i, prompt in enumerate(prompts):
        ids = systems.encode(prompt)
        record = systems.run_hf(Variant("hf"), ids, options.seed)
        ended = len(record.token_ids) < options.max_tokens
        traces.append(GreedyTrace(tuple(ids), tuple(record.token_ids), ended))
        if (i + 1) % 8 == 0 or i + 1 == len(prompts):
            progress(f"greedy continuations: {i + 1}/{len(prompts)}")
    systems.close()
    return systems, traces


def run_tune(options: TuneOptions, progress: Callable[[str], None] | None = None) -> dict:
    """Continuations, split, search, held-out scores: the result (see the module)."""
    from draft_service.drafting import Drafter

    options.validate()
    say = progress or (lambda _msg: None)
    prompts = load_prompt_file(options.prompts, options.max_prompts)
    started = time.perf_counter()
    systems, traces = greedy_traces(options, prompts, say)
    graph = systems.decoder.graph
    drafter = Drafter(graph)
    window = graph.max_order
    max_context = systems.decoder.verifier.info.max_context_length

    def simulate(params: DraftParams, part: list[GreedyTrace]) -> SimResult:
        return simulate_all(drafter, params, part, options.max_tokens, window, max_context)

    train, heldout = split(traces, options.train_fraction, options.seed)
    scorer = Scorer(simulate, train, options.metric)
    best = search(scorer, DraftParams(k=options.k, tree_nodes=options.tree_nodes), say)
    winner = _best(scorer, best.values())  # ties: the first in the table, the default first
    held = Scorer(simulate, heldout, options.metric)
    rows = []
    marked = False  # the winner's first row is marked (the default's, when it won)
    for name, params in best.items():
        held(params)
        chosen = params == winner and not marked
        marked = marked or chosen
        rows.append(
            {
                "name": name,
                "params": mixing_of(params),
                "describe": describe(params),
                "chosen": chosen,
                "train": scorer.results[params].as_dict(),
                "heldout": held.results[params].as_dict(),
            }
        )
    current = graph.draft_defaults
    return {
        "settings": asdict(options),
        "prompts": {"train": len(train), "heldout": len(heldout)},
        "metric": options.metric,
        "candidates_tried": len(scorer.order),
        "seconds": time.perf_counter() - started,
        "graph_tuned_before": current,
        "rows": rows,
        "candidates": [
            {"describe": describe(params), "train": scorer.results[params].as_dict()}
            for params in scorer.order
        ],
        "best": mixing_of(winner),
    }


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
        f"{result['candidates_tried']} candidates, {result['seconds']:.1f} s)"
    )
    return "\n".join(lines)


def print_progress(message: str) -> None:
    """Progress lines go to stderr (stdout holds the table)."""
    print(f"tune: {message}", file=sys.stderr, flush=True)
