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
goes on where it stopped, and other weights replay without generating (--weight).

--samples N also appends N sampled answers per training prompt (as ``speculant distill
--samples N``): round j at --sample-temperature, kept in train-sample{j}-t{T}-s{seed}.json (so
--samples 2 reuses the round of --samples 1), seeded as distill seeds it
(distill.generation.sample_seed, per chunk); budget b appends the first b prompts' greedy
answers at --weight and their samples at --sample-weight. --loop-ngram N --loop-repeats K cut
every appended answer where it loops (distill.generation.cut_loops; ``--loop-cut N,K``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.distill import budget_rows, default_drafts, format_table, measure_tau
from distill.generation import Generation, cut_loops, generate_continuations, sample_seed
from distill.replay import GreedyTrace, kind_labels, kinds_in, replayed_drafts
from distill.run import sample_weight_default
from speculant.prompt_records import load_prompts


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def generate(
    loaded: Any,
    ids: list[list[int]],
    args: argparse.Namespace,
    sample: int = 0,
    seed: int = 0,
) -> list[Generation]:
    """The continuations of ids in their order: greedy (sample 0), or sample round `sample` at
    --sample-temperature, its batches seeded from seed."""
    eos = list(loaded.eos_token_ids)
    pad = loaded.tokenizer.pad_token_id
    return sorted(
        generate_continuations(
            loaded.model,
            ids,
            max_tokens=args.max_tokens,
            temperature=args.sample_temperature if sample else 0.0,
            batch_size=args.batch_size,
            eos_token_ids=eos,
            pad_token_id=eos[0] if pad is None else pad,
            seed=seed,
            sample=sample,
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

    def extend(
        self,
        loaded: Any,
        ids: list[list[int]],
        args: argparse.Namespace,
        sample: int = 0,
        seed: int = 0,
    ) -> None:
        started = time.perf_counter()
        new = generate(loaded, ids, args, sample, seed)
        self.seconds += time.perf_counter() - started
        self.tokens += sum(len(g.continuation_ids) for g in new)
        offset = len(self.items)
        self.items += [
            Generation(offset + g.index, g.prompt_ids, g.continuation_ids, sample) for g in new
        ]
        self.path.write_text(json.dumps([asdict(g) for g in self.items]), encoding="utf-8")


def fold_rows(
    args: argparse.Namespace,
    budgets: list[int],
    loaded: Any,
    pick: Callable[[int], list[Generation]],
    traces: list[GreedyTrace],
    labels: list[str],
) -> list[dict[str, Any]]:
    """A row per budget b: bench distill's figures of the replays with a scratch copy of the
    graph that has the first b prompts' generations (pick(b)) appended, the greedy ones at
    --weight, the sampled ones at --sample-weight, loops cut with --loop-ngram (budget 0: the
    graph)."""
    from builder.append import read_base_meta

    options = SimpleNamespace(
        weight=args.weight,
        sample_weight=sample_weight(args),
        samples=args.samples,
        sample_temperature=args.sample_temperature,
        loop_ngram=args.loop_ngram,
        loop_repeats=args.loop_repeats,
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
        [],
        budgets,
        0.0,
        lambda graph: measure_tau(
            graph, traces, labels, params, args.max_tokens, loaded.max_context
        ),
        None,
        pick,
    )


def sample_weight(args: argparse.Namespace) -> float:
    """The weight of sampled answers: --sample-weight, else distill's default (half of
    --weight, rounded up)."""
    if args.sample_weight is None:
        return sample_weight_default(int(args.weight))
    return args.sample_weight


def rows_cut(args: argparse.Namespace, generations: list[Generation]) -> dict[str, int]:
    """How many of the generations --loop-ngram cuts, and the tokens it cuts."""
    cut = [
        len(g.continuation_ids)
        - len(cut_loops(g.continuation_ids, args.loop_ngram, args.loop_repeats))
        for g in generations
    ]
    return {"answers": sum(c > 0 for c in cut), "tokens": sum(cut)}


def paired_difference(
    base: dict[str, Any], new: dict[str, Any], labels: list[str], resamples: int = 1000
) -> dict[str, list[float]]:
    """tau over all tokens of row `new` minus that of row `base` (two rows of the same prompts,
    their per_prompt counts), over all prompts and per kind: [difference, low, high], the
    percentile bootstrap 95% interval resampling prompts (the same draw for both rows, seed 0):
    paired, so tighter than the two rows' own intervals."""
    import random

    out: dict[str, list[float]] = {}
    for kind in ["all", *kinds_in(labels)]:
        rows = [i for i, label in enumerate(labels) if kind in ("all", label)]
        pairs = [(base["per_prompt"][i][:2], new["per_prompt"][i][:2]) for i in rows]

        def tau_diff(sample: list[tuple[list[int], list[int]]]) -> float:
            b = sum(p[0][0] for p in sample) / max(sum(p[0][1] for p in sample), 1)
            n = sum(p[1][0] for p in sample) / max(sum(p[1][1] for p in sample), 1)
            return n - b

        rng = random.Random(0)
        diffs = sorted(
            tau_diff([pairs[rng.randrange(len(pairs))] for _ in pairs]) for _ in range(resamples)
        )
        low, high = diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples)]
        out[kind] = [tau_diff(pairs), low, high]
    return out


def training_rounds(loaded: Any, train_records: list, args: argparse.Namespace) -> list[Generated]:
    """The training prompts' generations, kept in --work: the greedy round, then each sample
    round (only what the work files lack is generated)."""
    rounds = [Generated(args.work / "train.json")]
    rounds += [
        Generated(args.work / f"train-sample{j}-t{args.sample_temperature:g}-s{args.seed}.json")
        for j in range(1, args.samples + 1)
    ]
    for sample, trained in enumerate(rounds):
        while len(trained.items) < len(train_records):
            start = len(trained.items)
            chunk = train_records[start : start + args.chunk]
            seed = sample_seed(args.seed, sample, len(train_records), start)
            ids = [r.token_ids(loaded.tokenizer) for r in chunk]
            trained.extend(loaded, ids, args, sample, seed)
            say(
                f"training generations{f' (sample {sample})' if sample else ''}: "
                f"{len(trained.items)}/{len(train_records)}, "
                f"{trained.tokens / max(trained.seconds, 1e-9):.1f} tokens/s, "
                f"{len(trained.items) / max(trained.seconds, 1e-9):.2f} generations/s"
            )
    return rounds


def report(
    result: dict[str, Any], args: argparse.Namespace, rows: list, labels: list, largest: int
) -> None:
    """Print the table and what was appended per prompt; with --compare, add the paired tau
    difference against that run at the largest budget to result."""
    print(format_table(result))
    print(
        f"per prompt: the greedy answer at weight {args.weight:g}"
        + (
            f" and {args.samples} sampled at temperature {args.sample_temperature:g}, weight "
            f"{sample_weight(args):g} (seed {args.seed})"
            if args.samples
            else ""
        )
        + (
            f"; loop cut {args.loop_ngram},{args.loop_repeats}: {result['cut']['answers']} "
            f"answers, {result['cut']['tokens']} tokens cut"
            if args.loop_ngram
            else ""
        )
    )
    if args.compare:  # paired against another run's row of the largest budget
        base = json.loads(args.compare.read_text(encoding="utf-8"))
        base_row = next(r for r in base["rows"] if r["generations"] == largest)
        new_row = next(r for r in rows if r["generations"] == largest)
        result["paired_vs"] = {
            "file": str(args.compare),
            "tau_difference": paired_difference(base_row, new_row, labels),
        }
        for kind, (diff, low, high) in result["paired_vs"]["tau_difference"].items():
            print(f"vs {args.compare.name}, {kind}: tau {diff:+.3f} ({low:+.3f} to {high:+.3f})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
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
    parser.add_argument(
        "--samples", type=int, default=0, help="sampled answers per training prompt (default 0)"
    )
    parser.add_argument("--sample-temperature", type=float, default=1.0)
    parser.add_argument(
        "--sample-weight",
        type=int,
        default=None,
        help="of sampled answers (default: half of --weight, rounded up, as distill)",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the sampled answers")
    parser.add_argument(
        "--loop-ngram", type=int, default=0, help="cut answers where an n-gram loops (0: off)"
    )
    parser.add_argument("--loop-repeats", type=int, default=2)
    parser.add_argument(
        "--compare",
        type=Path,
        help="a --json of the same prompts: the paired tau difference at the largest budget",
    )
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
    rounds = training_rounds(loaded, train_records, args)

    def pick(budget: int) -> list[Generation]:
        """The first `budget` prompts' generations: their greedy ones, then each sample round's
        (runs of one weight: two appends)."""
        return [g for trained in rounds for g in trained.items[:budget]]

    rows = fold_rows(args, budgets, loaded, pick, traces, labels)
    params = default_drafts()
    seconds = evaluated.seconds + sum(t.seconds for t in rounds)
    generated = len(evaluated.items) * (evaluated.seconds > 0) + sum(
        len(t.items) * (t.seconds > 0) for t in rounds
    )
    new_tokens = evaluated.tokens + sum(t.tokens for t in rounds)
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
        "generated_tokens": new_tokens,
        "samples": args.samples,
        "sample_temperature": args.sample_temperature,
        "sample_weight": sample_weight(args),
        "seed": args.seed,
        "loop_ngram": args.loop_ngram,
        "loop_repeats": args.loop_repeats,
        "cut": rows_cut(args, pick(max(budgets))),
        "rows": rows,
    }
    report(result, args, rows, labels, max(budgets))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
