"""tau on held-out chat prompts against the answers a draft tier has learned online.

A draft service learns every generation it serves (prompt and answer, the live layer of
:mod:`draft_service.learning`, at its default weight). This replays greedy speculative decoding
of held-out prompts (every drafted token verified: tau under a flat cost profile) with drafts
from the graph plus a live layer that has learned the first N of a set of served answers, for
each N: what a stack that has served N other chat answers drafts, against a cold one.

Inputs are ``scripts/fold_bench.py``'s work files (JSON lists of {index, prompt_ids,
continuation_ids}): --served (e.g. its train.json, the answers to the training folds) and --eval
(its eval.json, the held-out prompts' greedy continuations; --eval-prompts gives their kinds).

    PYTHONPATH=. .venv/bin/python scripts/online_curve.py --graph g-docs \\
        --served FOLDS/w/train.json --eval FOLDS/w/eval.json \\
        --eval-prompts FOLDS/data/eval.jsonl --first 253 --served-counts 0,100,300,765
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.distill import bootstrap_tau, default_drafts
from distill.replay import GreedyTrace, kind_labels, kinds_in, simulate
from speculant.prompt_records import load_prompts


def load_generations(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def tau_of(results: list) -> tuple[float, float, float]:
    """tau over all tokens of replayed prompts, with its bootstrap 95% interval."""
    counts = [(r.tokens, r.forwards) for r in results]
    tau = sum(t for t, _ in counts) / max(1, sum(f for _, f in counts))
    return (tau, *bootstrap_tau(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--served", type=Path, required=True)
    parser.add_argument("--eval", type=Path, required=True)
    parser.add_argument("--eval-prompts", type=Path, required=True)
    parser.add_argument("--first", type=int, default=0, help="the first N eval prompts (0: all)")
    parser.add_argument("--served-counts", default="0,100,300")
    parser.add_argument(
        "--learn-weight",
        type=float,
        default=None,
        help="the live layer's weight (default: its own)",
    )
    parser.add_argument(
        "--long-context",
        type=int,
        default=0,
        help="draft with the longest match too (serve-draft's)",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from draft_service.drafting import Drafter
    from draft_service.learning import LiveLayer
    from speculant.graph_reader import NGramGraph

    records = load_prompts(args.eval_prompts)
    evaluated = load_generations(args.eval)
    first = args.first or len(records)
    labels = kind_labels(records)[:first]
    traces = [
        GreedyTrace(
            tuple(g["prompt_ids"]),
            tuple(g["continuation_ids"]),
            len(g["continuation_ids"]) < args.max_tokens,
        )
        for g in evaluated[:first]
    ]
    served = load_generations(args.served)
    params = default_drafts()
    rows = []
    graph = NGramGraph.open(args.graph)
    graph.use_long_context(args.long_context)
    try:
        for count in (int(c) for c in args.served_counts.split(",")):
            live = LiveLayer(graph.max_order, build_share=float("inf"))
            if args.learn_weight is not None:
                live.weight = args.learn_weight
            for g in served[:count]:
                live.learn(g["prompt_ids"] + g["continuation_ids"])
            drafter = Drafter(graph, live=live if count else None)
            results = [simulate(drafter, params, t, args.max_tokens, graph.window) for t in traces]
            taus = {"all": tau_of(results)}
            sets = sorted({kind.split("-")[0] for kind in kinds_in(labels) if "-" in kind})
            groups = [(kind, kind) for kind in kinds_in(labels)] + [
                (f"{s}-*", s + "-") for s in sets
            ]
            for name, prefix in groups:  # each kind, and each set of kinds (fold3-ask: fold3)
                taus[name] = tau_of(
                    [r for r, lb in zip(results, labels, strict=True) if lb.startswith(prefix)]
                )
            rows.append({"served": count, "tau_ci95": taus})
            cells = ", ".join(
                f"{key} {tau:.2f} ({low:.2f}-{high:.2f})" for key, (tau, low, high) in taus.items()
            )
            print(f"{count} answers learned: {cells}", flush=True)
    finally:
        graph.close()
    if args.json:
        args.json.write_text(json.dumps({"graph": str(args.graph), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
