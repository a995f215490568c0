"""Re-choose the drafting defaults on folds (issue #39: tune on folds, never on a dozen
prompts): the Witten-Bell escape weight, the overlay weight and the mixing (witten-bell or
backoff) are scored on one fold and the choice is checked on another, by replay (no model).

Inputs are what ``scripts/chat_folds.py`` and ``scripts/fold_bench.py`` wrote: the folds'
prompt records (``fold-<i>.jsonl``, ``train.jsonl`` = the training folds in its order,
``eval.jsonl`` = the held-out fold then dev) and the model's greedy answers
(``train.json`` / ``eval.json``: Generation records in those files' orders). Each training
answer is matched to its fold by its prompt record.

1. ``--tune-graph`` (built when missing: a copy of ``--base`` with the answers of
   ``--append-folds`` appended at ``--weight``, as ``speculant distill`` appends) is scored on
   the answers of ``--tune-fold`` (not appended) for every candidate of the grid.
2. The built-in defaults, the fold's best and the best of each single parameter changed alone
   are checked on the held-out fold's answers with each ``--check-graph`` (every candidate
   with ``--check-all``).

A candidate's figures are bench distill's (:func:`bench.distill.figures`: tau over all tokens,
its bootstrap 95% interval over prompts, per kind), every drafted token verified (a flat cost:
k and tree_nodes stay at the defaults, they are size limits priced by cost, not by tau); each
candidate's gain on the default is given with a paired bootstrap interval (the same prompts
resampled for both, :func:`paired_gain`), the noise that decides whether a gain holds.

    PYTHONPATH=. python scripts/fold_tune.py --folds FOLDS/data --answers FOLDS/w \\
        --base g-docs --tune-graph OUT/g-folds01 --check-graph g-dist --check-graph g-docs \\
        --json OUT/fold-tune.json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.distill import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, default_drafts, figures
from distill.generation import Generation
from distill.replay import GreedyTrace, SimResult, simulate
from speculant.config import BUILTIN_TUNABLE_DEFAULTS, DraftParams

MAX_TOKENS = 128
MAX_CONTEXT = 8192  # SmolLM2's max_position_embeddings (every prompt is far shorter)


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def key(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)


def fold_of_each(records: Sequence[dict[str, Any]], folds: Sequence[Sequence[dict]]) -> list[int]:
    """The fold each record is in (matched by its whole prompt record); ValueError for a record
    in no fold or in two."""
    where: dict[str, int] = {}
    for i, fold in enumerate(folds):
        for record in fold:
            if where.setdefault(key(record), i) != i:
                raise ValueError(f"a record is in folds {where[key(record)]} and {i}: {record}")
    missing = [r for r in records if key(r) not in where]
    if missing:
        raise ValueError(f"{len(missing)} records are in no fold, e.g. {missing[0]}")
    return [where[key(r)] for r in records]


def paired_gain(
    base: Sequence[tuple[int, int]],
    other: Sequence[tuple[int, int]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(gain, low, high): other's tau over all tokens / base's - 1 on the same prompts (each
    holds a prompt's (tokens, forwards), in the same order), and its percentile bootstrap
    interval with the prompts resampled together (a paired bootstrap: what two settings share,
    the prompts' difficulty, cancels out)."""
    if len(base) != len(other):
        raise ValueError("paired_gain needs the same prompts on both sides")
    if not base:
        return 0.0, 0.0, 0.0

    def gain(indices: Sequence[int]) -> float:
        b_tokens = sum(base[i][0] for i in indices)
        b_forwards = sum(base[i][1] for i in indices)
        o_tokens = sum(other[i][0] for i in indices)
        o_forwards = sum(other[i][1] for i in indices)
        return (o_tokens / o_forwards) / (b_tokens / b_forwards) - 1.0

    n = len(base)
    rng = random.Random(seed)
    gains = sorted(gain([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2
    low = gains[int(tail * resamples)]
    high = gains[min(resamples - 1, int((1.0 - tail) * resamples))]
    return gain(range(n)), low, high


def traces_of(generations: Sequence[Generation]) -> list[GreedyTrace]:
    """The replay's traces of generations (an answer shorter than MAX_TOKENS ended by EOS), as
    scripts/fold_bench.py reads them."""
    return [
        GreedyTrace(
            tuple(g.prompt_ids), tuple(g.continuation_ids), len(g.continuation_ids) < MAX_TOKENS
        )
        for g in generations
    ]


def build_graph(base: Path, out: Path, generations: Sequence[Generation], weight: float) -> int:
    """A copy of base with the generations appended at weight, as
    :func:`distill.run.append_generations` appends them (the tokenizer from the graph's meta;
    no model: the distilled record carries no model fingerprint); the tokens counted."""
    from builder.append import read_base_meta
    from builder.graph_builder import GraphBuilder

    meta = read_base_meta(base)
    scratch = out.with_name(out.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(base, scratch)
    builder = GraphBuilder(
        tokenizer_name=meta.tokenizer_name, max_order=meta.max_order, progress=False, workers=1
    )
    try:
        builder.check_append(scratch)
        builder.build_from_token_documents(
            ((g.prompt_ids + g.continuation_ids, len(g.prompt_ids)) for g in generations),
            source="distill:fold-tune",
            weight=weight,
        )
        builder.note_distilled({"generations": len(generations), "weight": weight})
        builder.save(scratch, append=True)
        tokens = builder.stats.tokens
    finally:
        builder.close()
    scratch.rename(out)
    return tokens


def candidates(escape_weights: Sequence[float], overlay_weights: Sequence[float]) -> list:
    """(name, params) of the grid, the built-in defaults first: witten-bell at each escape
    weight and backoff, each at every overlay weight; every drafted token verified."""
    default = default_drafts()
    grid = [("default", default)]
    for overlay in overlay_weights:
        for escape in escape_weights:
            params = replace(default, mixing="witten-bell", escape_weight=escape)
            grid.append(
                (f"wb b={escape:g} ov={overlay:g}", replace(params, overlay_weight=overlay))
            )
        params = replace(default, mixing="backoff", overlay_weight=overlay)
        grid.append((f"backoff ov={overlay:g}", params))
    return grid


class Replayer:
    """Replays candidates on one graph (opened once) and a set of labelled traces."""

    def __init__(self, graph: Path, traces: Sequence[GreedyTrace], labels: Sequence[str]) -> None:
        from draft_service.drafting import Drafter
        from speculant.graph_reader import NGramGraph

        self.graph = NGramGraph.open(graph)
        self.drafter = Drafter(self.graph)
        self.traces, self.labels = list(traces), list(labels)

    def run(self, params: DraftParams) -> list[SimResult]:
        window = self.graph.window
        return [
            simulate(self.drafter, params, t, MAX_TOKENS, window, MAX_CONTEXT) for t in self.traces
        ]

    def row(self, name: str, params: DraftParams, base: list[SimResult] | None) -> dict:
        """bench distill's figures of a candidate, per kind too, with its paired gain on base."""
        started = time.perf_counter()
        results = self.run(params)
        row: dict[str, Any] = {"name": name, "resolved": resolved(self.drafter, params)}
        row |= figures(results)
        row["by_kind"] = {
            kind: figures(
                [r for r, label in zip(results, self.labels, strict=True) if label == kind]
            )
            for kind in dict.fromkeys(self.labels)
        }
        counts = [(r.tokens, r.forwards) for r in results]
        row["per_prompt"] = [list(c) for c in counts]
        if base is not None:
            row["gain_on_default"] = list(
                paired_gain([(r.tokens, r.forwards) for r in base], counts)
            )
        row["seconds"] = time.perf_counter() - started
        return row

    def close(self) -> None:
        self.graph.close()


def resolved(drafter: Any, params: DraftParams) -> dict[str, Any]:
    full = drafter.resolve(params)
    return {
        "mixing": full.effective_mixing,
        "escape_weight": full.escape_weight,
        "overlay_weight": full.overlay_weight,
        "k": full.k,
        "tree_nodes": full.tree_nodes,
    }


def score_all(replayer: Replayer, grid: Sequence[tuple[str, DraftParams]], what: str) -> list:
    base = replayer.run(grid[0][1])
    rows = []
    for name, params in grid:
        rows.append(replayer.row(name, params, base))
        r = rows[-1]
        gain = r.get("gain_on_default", [0, 0, 0])
        say(
            f"{what} {name}: tau {r['tau_all_tokens']:.3f} ({r['tau_ci95'][0]:.2f}-"
            f"{r['tau_ci95'][1]:.2f}), gain {gain[0]:+.1%} ({gain[1]:+.1%}..{gain[2]:+.1%}), "
            f"{r['seconds']:.0f} s"
        )
    return rows


def checked(rows: Sequence[dict], grid: Sequence[tuple[str, DraftParams]]) -> list:
    """The candidates checked on the held-out fold: the default, the best of the grid and the
    best with one parameter changed from the default (escape weight alone, overlay weight alone,
    backoff at the default overlay; none where the grid has no such candidate)."""
    by_name = dict(grid)
    default = grid[0][1]
    builtin_escape = BUILTIN_TUNABLE_DEFAULTS["escape_weight"]

    def best(keep) -> str | None:
        names = [r for r in rows if keep(by_name[r["name"]])]
        return max(names, key=lambda r: r["tau_all_tokens"])["name"] if names else None

    picks = [
        "default",
        best(lambda p: True),
        best(lambda p: p.overlay_weight == default.overlay_weight and p.mixing != "backoff"),
        best(lambda p: p.escape_weight in (None, builtin_escape) and p.mixing != "backoff"),
        best(lambda p: p.mixing == "backoff" and p.overlay_weight == default.overlay_weight),
    ]
    names = [name for name in dict.fromkeys(picks) if name is not None]
    return [(name, by_name[name]) for name in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folds", type=Path, required=True, help="fold-<i>.jsonl, train.jsonl")
    parser.add_argument("--answers", type=Path, required=True, help="train.json, eval.json")
    parser.add_argument("--base", type=Path, required=True, help="the undistilled graph")
    parser.add_argument("--tune-graph", type=Path, required=True)
    parser.add_argument("--append-folds", default="0,1")
    parser.add_argument("--tune-fold", type=int, default=2)
    parser.add_argument("--held-out-fold", type=int, default=3)
    parser.add_argument("--check-graph", type=Path, action="append", default=[])
    parser.add_argument("--weight", type=float, default=4)
    parser.add_argument("--escape-weights", default="2,4,8,16,32")
    parser.add_argument("--overlay-weights", default="0,16,32,64,128,256")
    parser.add_argument("--check-all", action="store_true", help="check every candidate")
    parser.add_argument("--json", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    folds = [read_jsonl(args.folds / f"fold-{i}.jsonl") for i in range(4)]
    train_records = read_jsonl(args.folds / "train.jsonl")
    eval_records = read_jsonl(args.folds / "eval.jsonl")
    train = [Generation(**g) for g in json.loads((args.answers / "train.json").read_text())]
    evaluated = [Generation(**g) for g in json.loads((args.answers / "eval.json").read_text())]
    if len(train) != len(train_records) or len(evaluated) != len(eval_records):
        raise SystemExit("the answers do not match the prompt files line for line")
    train_fold = fold_of_each(train_records, folds)
    held = folds[args.held_out_fold]
    # eval.jsonl labels the held-out fold's kinds "fold<i>-<kind>": compare the rest
    if [key(r | {"kind": 0}) for r in eval_records[: len(held)]] != [
        key(r | {"kind": 0}) for r in held
    ]:
        raise SystemExit(f"eval.jsonl does not start with fold {args.held_out_fold}")
    appended = {int(i) for i in args.append_folds.split(",")}
    if args.tune_fold in appended:
        raise SystemExit("the tuning fold must not be appended")

    if not args.tune_graph.exists():
        chosen = [g for g, fold in zip(train, train_fold, strict=True) if fold in appended]
        say(f"building {args.tune_graph}: {len(chosen)} answers of folds {sorted(appended)}")
        tokens = build_graph(args.base, args.tune_graph, chosen, args.weight)
        say(f"built: {tokens} tokens appended")
    tune_at = [i for i, fold in enumerate(train_fold) if fold == args.tune_fold]
    tune_traces = traces_of([train[i] for i in tune_at])
    tune_labels = [train_records[i]["kind"] for i in tune_at]
    held_traces = traces_of(evaluated[: len(held)])
    held_labels = [r["kind"] for r in held]

    grid = candidates(
        [float(x) for x in args.escape_weights.split(",")],
        [float(x) for x in args.overlay_weights.split(",")],
    )
    result: dict[str, Any] = {
        "tune": {
            "graph": str(args.tune_graph),
            "appended_folds": sorted(appended),
            "appended_answers": sum(f in appended for f in train_fold),
            "weight": args.weight,
            "fold": args.tune_fold,
            "prompts": len(tune_traces),
        },
        "held_out": {"fold": args.held_out_fold, "prompts": len(held_traces)},
        "max_tokens": MAX_TOKENS,
        "verified": "every drafted token (a flat cost profile)",
    }
    say(f"tuning on fold {args.tune_fold}: {len(tune_traces)} prompts, {len(grid)} candidates")
    replayer = Replayer(args.tune_graph, tune_traces, tune_labels)
    try:
        result["tune"]["rows"] = score_all(replayer, grid, f"fold {args.tune_fold}")
    finally:
        replayer.close()
    args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    picks = grid if args.check_all else checked(result["tune"]["rows"], grid)
    result["checked"] = [name for name, _ in picks]
    result["held_out"]["graphs"] = {}
    for graph in args.check_graph:
        replayer = Replayer(graph, held_traces, held_labels)
        try:
            rows = score_all(replayer, picks, f"fold {args.held_out_fold} {graph.name}")
        finally:
            replayer.close()
        result["held_out"]["graphs"][str(graph)] = rows
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
