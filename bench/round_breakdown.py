"""Where a round's time goes, per variant: p50 / p99 / mean of each part of the Verify rounds
(GenerationStats.round_times, see gateway.generation.RoundTimes; the prefill not included), what
the services add to the same round embedded, and their table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bench.settings import Variant
from gateway.generation import FIELDS, PARTS

BEYOND_FORWARD = "beyond_forward"  # round - forward: what a round costs beside the model
COLUMNS = (*FIELDS, BEYOND_FORWARD)
LABELS = {"draft_hop": "draft hop", "verify_hop": "verify hop", BEYOND_FORWARD: "beyond fwd"}


def merge_round_times(stats: Iterable[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The rounds of several generations' stats (their ``round_times``), one list a field."""
    merged: dict[str, list[float]] = {name: [] for name in FIELDS}
    for figures in stats:
        times = figures.get("round_times") or {}
        for name in FIELDS:
            merged[name].extend(float(v) for v in times.get(name, ()))
    return merged


def breakdown(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """p50, p99 and mean (ms) of every part over all the rows' rounds (per-prompt rows with
    ``round_times``); None when they hold no round."""
    times = merge_round_times(rows)
    if not times["round"]:
        return None
    times[BEYOND_FORWARD] = [r - f for r, f in zip(times["round"], times["forward"], strict=True)]
    figures: dict[str, Any] = {"verify_rounds": len(times["round"])}
    for name in COLUMNS:
        values = 1e3 * np.asarray(times[name])
        p50, p99 = np.percentile(values, [50, 99])
        figures[name] = {
            "p50_ms": float(p50),
            "p99_ms": float(p99),
            "mean_ms": float(values.mean()),
        }
    return figures


def services_overhead(
    variants: Sequence[Variant], summary: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per services variant with an embedded twin (the same drafting) in the run: what its round
    costs more, p50 of the round and of the round beyond the forward, and per part the mean."""
    names = {v.name for v in variants}
    out: dict[str, dict[str, Any]] = {}
    for variant in variants:
        twin = replace(variant, system="embedded").name
        if variant.system != "services" or twin not in names:
            continue
        served, embedded = (
            summary[variant.name].get("round_breakdown"),
            summary[twin].get("round_breakdown"),
        )
        if not served or not embedded:
            continue
        out[variant.name] = {
            "embedded": twin,
            "round_p50_ms": served["round"]["p50_ms"] - embedded["round"]["p50_ms"],
            "beyond_forward_p50_ms": served[BEYOND_FORWARD]["p50_ms"]
            - embedded[BEYOND_FORWARD]["p50_ms"],
            "mean_ms": {
                name: served[name]["mean_ms"] - embedded[name]["mean_ms"]
                for name in ("round", *PARTS)
            },
        }
    return out


def format_round_table(result: Mapping[str, Any]) -> str:
    """Per variant, each part's p50 / p99 in ms; then what the services add per round."""
    rows = {
        name: f["round_breakdown"]
        for name, f in result["summary"].items()
        if f.get("round_breakdown")
    }
    if not rows:
        return ""
    first = max(len("variant"), *(len(name) for name in rows))
    width = 13
    header = "  ".join(
        ["variant".ljust(first), "rounds".rjust(6)]
        + [LABELS.get(name, name).rjust(width) for name in COLUMNS]
    )
    lines = [
        "per Verify round (the prefill not included), ms: p50 / p99",
        header,
        "-" * len(header),
    ]
    for name, figures in rows.items():
        cells = [name.ljust(first), str(figures["verify_rounds"]).rjust(6)]
        for part in COLUMNS:
            cell = f"{figures[part]['p50_ms']:.3f} / {figures[part]['p99_ms']:.2f}"
            cells.append(cell.rjust(width))
        lines.append("  ".join(cells))
    for name, extra in result.get("round_overhead", {}).items():
        means = ", ".join(
            f"{LABELS.get(part, part)} {extra['mean_ms'][part]:+.3f}" for part in PARTS
        )
        lines.append(
            f"{name} against {extra['embedded']}: round p50 {extra['round_p50_ms']:+.3f} ms, "
            f"beyond the forward p50 {extra['beyond_forward_p50_ms']:+.3f} ms; mean per round "
            f"{extra['mean_ms']['round']:+.3f} ms = {means}"
        )
    return "\n".join(lines)
