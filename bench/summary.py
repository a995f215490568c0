"""Per-prompt figures and their summaries: medians over prompts, totals, speedups against `hf`."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.constrained import answer_values
from bench.round_breakdown import breakdown, merge_round_times
from bench.settings import RunRecord, Variant
from speculant.prompt_records import PromptRecord


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _sum_lists(lists: Sequence[Sequence[int]]) -> list[int]:
    out: list[int] = []
    for values in lists:
        if len(values) > len(out):
            out.extend([0] * (len(values) - len(out)))
        for i, v in enumerate(values):
            out[i] += int(v)
    return out


def per_prompt_values(records: list[RunRecord], reference: list[RunRecord] | None) -> dict:
    """The per-prompt figures of one variant (medians over the repetitions)."""
    tokens = len(records[0].token_ids)
    wall = statistics.median(r.wall_seconds for r in records)
    row: dict[str, Any] = {
        "tokens": tokens,
        "wall_seconds": [round(r.wall_seconds, 6) for r in records],
        "tokens_per_second": _ratio(tokens, wall),
        "rounds": records[0].rounds,
        "tau": _ratio(tokens, records[0].rounds),
        "outputs_differ_between_repetitions": any(
            r.token_ids != records[0].token_ids for r in records
        ),
    }
    if records[0].valid is not None:  # a constrained prompt
        row.update(constrained=True, finished=records[0].finished, valid=records[0].valid)
    if reference is not None:
        ref_wall = statistics.median(r.wall_seconds for r in reference)
        ref_tps = _ratio(len(reference[0].token_ids), ref_wall)
        row["speedup"] = _ratio(row["tokens_per_second"] or 0.0, ref_tps or 0.0)
        row["identical_to_hf"] = all(r.token_ids == reference[0].token_ids for r in records)
    stats = [r.stats for r in records if r.stats is not None]
    if stats:

        def med(key: str) -> float:
            return statistics.median(float(s[key]) for s in stats)

        row.update(
            draft_tokens=int(stats[0]["draft_tokens"]),
            accepted_tokens=int(stats[0]["accepted_tokens"]),
            acceptance_rate=float(stats[0]["acceptance_rate"]),
            accepted_by_position=_sum_lists([s["accepted_by_position"] for s in stats]),
            drafted_by_position=_sum_lists([s["drafted_by_position"] for s in stats]),
            total_seconds=med("total_seconds"),
            draft_seconds=med("draft_seconds"),
            verify_seconds=med("verify_seconds"),
            other_seconds=med("other_seconds"),
            client_overhead_seconds=statistics.median(
                r.wall_seconds - float(r.stats["total_seconds"]) for r in records if r.stats
            ),
            draft_failures=sum(int(s["draft_failures"]) for s in stats),
            prompt_tokens=int(stats[0]["prompt_tokens"]),
            round_times=merge_round_times(stats),  # every repetition's rounds
        )
        for key in (
            "accepted_from_graph",
            "accepted_from_overlay",
            "accepted_from_both",
            "wasted_draft_tokens",
            "accepted_from_grammar",
        ):
            if key in stats[0]:
                row[key] = int(stats[0][key])
    return row


def summarize_variant(rows: list[dict], temperature: float) -> dict[str, Any]:
    """Medians over prompts of the per-prompt values, plus totals (sums, then ratios)."""
    total_tokens = sum(r["tokens"] for r in rows)
    total_wall = sum(statistics.median(r["wall_seconds"]) for r in rows)
    total_rounds = sum(r["rounds"] for r in rows)
    out: dict[str, Any] = {
        "prompts": len(rows),
        "tokens_total": total_tokens,
        "tokens_median": _median([r["tokens"] for r in rows]),
        "tokens_per_second_median": _median([r["tokens_per_second"] for r in rows]),
        "tokens_per_second_total": _ratio(total_tokens, total_wall),
        "wall_seconds_total": total_wall,
        "tau_median": _median([r["tau"] for r in rows]),
        "tau_total": _ratio(total_tokens, total_rounds),
        "rounds_total": total_rounds,
        "speedup_median": _median([r.get("speedup") for r in rows]),
    }
    out.update(answer_values(rows))
    if "identical_to_hf" in rows[0]:
        out["exact_mismatches"] = (
            sum(not r["identical_to_hf"] for r in rows) if temperature == 0 else None
        )
    if "draft_tokens" in rows[0]:
        drafted = sum(r["draft_tokens"] for r in rows)
        accepted_by_pos = _sum_lists([r["accepted_by_position"] for r in rows])
        drafted_by_pos = _sum_lists([r["drafted_by_position"] for r in rows])
        out.update(
            acceptance_rate_median=_median([r["acceptance_rate"] for r in rows]),
            acceptance_rate_total=_ratio(sum(r["accepted_tokens"] for r in rows), drafted),
            acceptance_by_position=[
                _ratio(a, d) for a, d in zip(accepted_by_pos, drafted_by_pos, strict=True)
            ],
            drafted_by_position=drafted_by_pos,
            draft_failures=sum(r["draft_failures"] for r in rows),
            wasted_draft_tokens=drafted - sum(r["accepted_tokens"] for r in rows),
        )
        for part in ("total", "draft", "verify", "other", "client_overhead"):
            values = [r[f"{part}_seconds"] for r in rows]
            out[f"{part}_seconds_median"] = _median(values)
            out[f"{part}_seconds_total"] = sum(values)
        out["verify_ms_per_round_total"] = 1e3 * out["verify_seconds_total"] / total_rounds
        out["round_breakdown"] = breakdown(rows)
        draft_rounds = total_rounds - len(rows)  # the prefill round has no draft
        out["draft_ms_per_round_total"] = (
            1e3 * out["draft_seconds_total"] / draft_rounds if draft_rounds else None
        )
    return out


def add_total_speedups(summary: dict[str, dict]) -> None:
    """speedup_total = the variant's total tokens/s over hf's; speedup_over_plain_total: over
    plain's (None without that system)."""
    base = summary.get("hf", {}).get("tokens_per_second_total")
    plain = summary.get("plain", {}).get("tokens_per_second_total")
    for figures in summary.values():
        tps = figures["tokens_per_second_total"]
        figures["speedup_total"] = _ratio(tps, base) if base and tps is not None else None
        figures["speedup_over_plain_total"] = (
            _ratio(tps, plain) if plain and tps is not None else None
        )


# --- the run -------------------------------------------------------------------------------


Runner = Callable[[Variant, PromptRecord, list[int], int], RunRecord]
