"""tau on held-out chat prompts against the distillation budget, cheaply enough for folds of
hundreds of prompts on a CPU: ``speculant bench distill`` with every continuation, the
held-out prompts' included, generated in batches (as ``speculant distill`` generates).

``speculant bench distill`` computes the held-out prompts' greedy continuations one prompt at a
time (exact: the continuation speculative decoding outputs); on a loaded 2-core CPU that is
~10x slower per token than distillation's batches. Here they are generated like the
distilled ones (greedy, left-padded batches of --batch-size), so a batch's padding may flip a
near-tie argmax now and then: the replayed tau is that of a continuation the model could have
given, close to but not always the unpadded one. The rest is bench distill's: for each budget b
the graph gets the first b training generations (in file order) appended at --weight, and the
rounds of greedy speculative decoding with the default drafts (every drafted token verified:
tau under a flat cost profile) are replayed per held-out prompt; figures per kind with a
bootstrap 95% interval over prompts (bench.distill.bootstrap_tau).

    PYTHONPATH=. .venv/bin/python scripts/fold_bench.py --graph g-docs \\
        --model ../shared/models/smollm2-135m-instruct --train FOLDS/train.jsonl \\
        --eval FOLDS/eval.jsonl --budgets 0,96,192,384 --work OUT/ --json OUT/bench.json

Generations are kept in --work (eval.json, train.json, written as they come), so a run cut short
goes on where it stopped, and other weights replay without the model (--weight).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.distill import budget_rows, default_drafts, format_table, measure_tau
from distill.generation import Generation, generate_continuations
from distill.replay import GreedyTrace, kind_labels, kinds_in, replayed_drafts
from speculant.prompt_records import load_prompts


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def generate(loaded: Any, ids: list[list[int]], args: argparse.Namespace) -> list[Generation]:
    eos = list(loaded.eos_token_ids)
    pad = loaded.tokenizer.pad_token_id
    return sorted(
        generate_continuations(
            loaded.model,
            ids,
            max_tokens=args.max_tokens,
            temperature=0.0,
            batch_size=args.batch_size,
            eos_token_ids=eos,
            pad_token_id=eos[0] if pad is None else pad,
        ),
        key=lambda g: g.index,
    )


class Generated:
    """Generations kept in a JSON file (a list of Generation records), rewritten chunk by chunk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        records = json.loads(path.read_text(encoding="utf-8")) if path.exists() else []
        self.items = [Generation(**record) for record in records]
        self.seconds = 0.0
        self.tokens = 0

    def extend(self, loaded: Any, ids: list[list[int]], args: argparse.Namespace) -> None:
        started = time.perf_counter()
        new = generate(loaded, ids, args)
        self.seconds += time.perf_counter() - started
        self.tokens += sum(len(g.continuation_ids) for g in new)
        offset = len(self.items)
        self.items += [Generation(offset + g.index, g.prompt_ids, g.continuation_ids) for g in new]
        self.path.write_text(json.dumps([asdict(g) for g in self.items]), encoding="utf-8")


def fold_rows(
    args: argparse.Namespace,
    budgets: list[int],
    loaded: Any,
    generations: list[Generation],
    traces: list[GreedyTrace],
    labels: list[str],
) -> list[dict[str, Any]]:
    """A row per budget b: bench distill's figures of the replays with a scratch copy of the
    graph that has the first b generations appended at --weight (budget 0: the graph)."""
    from builder.append import read_base_meta

    options = SimpleNamespace(
        weight=args.weight,
        model=args.model,
        max_tokens=args.max_tokens,
        temperature=0.0,
        chat=True,
        seed=0,
    )
    job = SimpleNamespace(
        options=options,
        loaded=loaded,
        graph=args.graph,
        meta=read_base_meta(args.graph),
        prompt_source="prompts",
        constraints=[],
    )
    params = default_drafts()
    return budget_rows(
        job,
        generations,
        budgets,
        0.0,
        lambda graph: measure_tau(
            graph, traces, labels, params, args.max_tokens, loaded.max_context
        ),
        None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--eval", type=Path, required=True)
    parser.add_argument("--budgets", default="0,96,192,384")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=96, help="training generations per save")
    parser.add_argument("--weight", type=float, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)

    from speculant.config import VerifierConfig
    from verifier_service.model import LoadedModel

    loaded = LoadedModel.load(
        VerifierConfig(model_name=args.model, device="cpu", torch_threads=args.threads)
    )
    eval_records = load_prompts(args.eval)
    labels = kind_labels(eval_records)
    evaluated = Generated(args.work / "eval.json")
    if len(evaluated.items) < len(eval_records):
        say(f"generating the continuations of {len(eval_records)} evaluation prompts")
        evaluated.extend(loaded, [r.token_ids(loaded.tokenizer) for r in eval_records], args)
        say(f"done: {evaluated.tokens} tokens in {evaluated.seconds:.0f} s")
    traces = [
        GreedyTrace(
            tuple(g.prompt_ids),
            tuple(g.continuation_ids),
            len(g.continuation_ids) < args.max_tokens,
        )
        for g in evaluated.items
    ]
    train_records = load_prompts(args.train)[: max(budgets)]
    trained = Generated(args.work / "train.json")
    while len(trained.items) < len(train_records):
        chunk = train_records[len(trained.items) : len(trained.items) + args.chunk]
        trained.extend(loaded, [r.token_ids(loaded.tokenizer) for r in chunk], args)
        say(
            f"training generations: {len(trained.items)}/{len(train_records)}, "
            f"{trained.tokens / max(trained.seconds, 1e-9):.1f} tokens/s"
        )
    rows = fold_rows(args, budgets, loaded, trained.items, traces, labels)
    params = default_drafts()
    seconds = evaluated.seconds + trained.seconds
    generated = len(evaluated.items) + len(trained.items) if seconds else 0
    result = {
        "graph": str(args.graph),
        "model": args.model,
        "eval_prompts": str(args.eval),
        "prompts": len(eval_records),
        "kinds": {kind: labels.count(kind) for kind in kinds_in(labels)},
        "traces": [
            [label, len(t.prompt_ids), len(t.tokens), t.ended_by_eos]
            for label, t in zip(labels, traces, strict=True)
        ],
        "eval_max_tokens": args.max_tokens,
        "draft": replayed_drafts(params),
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "weight": args.weight,
        "device": str(loaded.device),
        "generate_seconds": seconds,
        "generations_per_second": generated / max(seconds, 1e-9),
        "generated_tokens": evaluated.tokens + trained.tokens,
        "rows": rows,
    }
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
