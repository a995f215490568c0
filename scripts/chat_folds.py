"""Split a chat prompts file (JSON lines with ``kind`` and ``function``) into N folds, so that
distillation and tuning can be measured on prompts of functions they never saw.

A record's fold is decided by a hash of its ``function`` (sha256), stratified by kind: within
each kind the records are ordered by that hash and dealt round-robin into the folds, so each
fold holds about 1/N of each kind and a function's fold never depends on the other records'
order. Files keep the input's order (the distill file interleaves the kinds, so the first b
records of a training file cover the kinds evenly, as ``--budgets`` takes them).

    .venv/bin/python scripts/chat_folds.py ../shared/corpus/python/distill_chat_prompts.jsonl \\
        --out folds/ --folds 4 --held-out 3 --eval-per-kind 40 \\
        --dev ../shared/corpus/python/dev_chat_prompts.jsonl

writes fold-0.jsonl ... fold-3.jsonl, train.jsonl (every fold but the held-out one: distil from
it) and, with --eval-per-kind, eval.jsonl: the first N records of each kind of the held-out fold
with kind "fold3-ask" and so on, followed by --dev's records with kind "dev-ask" and so on (one
evaluation file whose kinds tell the held-out fold from the dev prompts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def fold_of_records(records: list[dict[str, Any]], folds: int) -> list[int]:
    """Each record's fold: within its kind, records ordered by sha256 of their function, dealt
    round-robin."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, record in enumerate(records):
        by_kind[str(record.get("kind", ""))].append(i)
    fold = [0] * len(records)
    for members in by_kind.values():
        members.sort(key=lambda i: hashlib.sha256(records[i]["function"].encode()).hexdigest())
        for rank, i in enumerate(members):
            fold[i] = rank % folds
    return fold


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def relabelled(records: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    return [{**r, "kind": f"{prefix}-{r.get('kind', 'none')}"} for r in records]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=3)
    parser.add_argument("--eval-per-kind", type=int, default=0)
    parser.add_argument("--dev", type=Path, help="prompts appended to eval.jsonl as dev-KIND")
    args = parser.parse_args(argv)
    records = read_jsonl(args.prompts)
    folds = fold_of_records(records, args.folds)
    args.out.mkdir(parents=True, exist_ok=True)
    for k in range(args.folds):
        write_jsonl(
            args.out / f"fold-{k}.jsonl", [r for r, f in zip(records, folds, strict=True) if f == k]
        )
    train = [r for r, f in zip(records, folds, strict=True) if f != args.held_out]
    write_jsonl(args.out / "train.jsonl", train)
    held = [r for r, f in zip(records, folds, strict=True) if f == args.held_out]
    print(f"{len(records)} records: {len(train)} to train on, {len(held)} held out")
    if args.eval_per_kind:
        taken: dict[str, int] = defaultdict(int)
        chosen = []
        for record in held:
            kind = str(record.get("kind", ""))
            if taken[kind] < args.eval_per_kind:
                taken[kind] += 1
                chosen.append(record)
        evaluation = relabelled(chosen, f"fold{args.held_out}")
        if args.dev:
            evaluation += relabelled(read_jsonl(args.dev), "dev")
        write_jsonl(args.out / "eval.jsonl", evaluation)
        print(f"eval.jsonl: {len(evaluation)} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
