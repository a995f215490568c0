"""What ``speculant tune`` (:mod:`bench.tune`) shows and stores of its result: the table of
every mode's best on the train and held-out parts (and per kind), and the record ``--write``
puts in the graph's meta (``tuned``)."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


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
