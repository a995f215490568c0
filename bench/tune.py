"""``speculant tune``: fit a graph's mixing parameters by measured tokens per verifier forward.

    speculant tune --graph G --model M --prompts FILE [--max-prompts 32] [--max-tokens 64]
        [--k 8] [--tree-nodes 12] [--train-fraction 0.5] [--metric tau|acceptance]
        [--json OUT] [--write]

1. The model's greedy continuation of every prompt is computed once (Hugging Face ``generate``,
   :func:`bench.greedy_sim.greedy_traces`). A prompt record is a text ``prompt`` or chat
   ``messages`` (rendered with the model's chat template and a generation prompt, as the chat
   route does), with an optional ``kind`` (:mod:`speculant.prompt_records`).
2. The prompts are shuffled (``--seed``) and split: a *train* part (``--train-fraction``) and a
   *held-out* part.
3. Candidate mixing settings are scored on the train part by replaying greedy speculative
   decoding against the continuations (:mod:`bench.greedy_sim`: exact rounds, no model
   calls): ``backoff``; ``witten-bell`` over a grid of escape weights, refined around the best;
   ``seed`` by coordinate search over its four weights from the built-in values
   (:mod:`bench.tune_search`).
4. The best train score wins (ties: the candidate tried first, the built-in default first of
   all); the table shows every mode's best and the built-in default on both parts, so the
   held-out column says whether the choice carries over to prompts it was not fitted on. When
   the records have kinds, every row's figures are also given per kind (records without one
   under "(none)"): the selection stays on the whole train part (the table:
   :mod:`bench.tune_report`).
5. ``--write`` stores the winner in the graph's meta record (``tuned``; atomically, with a new
   manifest, :mod:`builder.meta_update`). Drafters then use it for every mixing parameter a
   request does not set.

Score: ``tau`` = generated tokens / verifier forwards (the prefill included) over the part, or
``acceptance`` = accepted / drafted draft tokens, with every drafted token verified
(``draft_size`` "fixed": tau under a flat cost profile, the figure that carries to a GPU).

A prompts file that cannot be used ends the command with one error line, exit status 2.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.greedy_sim import GreedyTrace, SimResult, prompt_traces, simulate_all
from bench.replay_report import every_8, kind_labels, kinds_in, replayed_drafts
from bench.tune_search import Scorer, best_of, describe, mixing_of, search
from speculant.cli_errors import EXIT_USAGE, CommandError
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES, DraftParams
from speculant.errors import InvalidArgumentError
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
