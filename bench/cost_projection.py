"""Projections of a speculative system on a larger verifier: from a `bench generate` run's tau,
mean draft length L and per-round overhead, and the forward costs cost_M(n) :mod:`bench.cost`
measures, projected tokens/s = tau / (cost_M(L + 1) + overhead) per variant and model (FORMULA;
every term is defined in :mod:`bench.cost`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FORMULA = (
    "projected tok/s = tau / (cost_M(L+1) + overhead); baseline tok/s = 1 / cost_M(1); "
    "speedup = projected / baseline; L = drafted / verify rounds; "
    "overhead = (draft + other + rpc) / rounds"
)


def cost_at(forward: dict[str, dict[str, float]], x: float) -> tuple[float, bool]:
    """(cost in seconds at x new tokens, extrapolated): linear between measured counts."""
    points = sorted((int(n), f["median_ms"] / 1e3) for n, f in forward.items())
    if len(points) == 1:
        return points[0][1], x != points[0][0]
    extrapolated = x < points[0][0] or x > points[-1][0]
    last = len(points) - 2
    segment = next(i for i in range(last + 1) if x <= points[i + 1][0] or i == last)
    (x0, y0), (x1, y1) = points[segment], points[segment + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0), extrapolated


def system_figures(name: str, figures: dict[str, Any]) -> dict[str, Any] | None:
    """tau, L and overhead per round of one speculative variant of a bench run, else None."""
    drafted_by_position = figures.get("drafted_by_position")
    rounds = figures.get("rounds_total") or 0
    if drafted_by_position is None or not rounds:
        return None
    verify_rounds = rounds - figures["prompts"]
    drafted = sum(drafted_by_position)
    parts = {
        part: figures.get(f"{part}_seconds_total") or 0.0
        for part in ("draft", "other", "client_overhead")
    }
    return {
        "variant": name,
        "tau": figures["tau_total"],
        "mean_draft_length": drafted / verify_rounds if verify_rounds else 0.0,
        "rounds": rounds,
        "overhead_ms_per_round": 1e3 * sum(parts.values()) / rounds,
        "draft_ms_per_round": 1e3 * parts["draft"] / rounds,
        "other_ms_per_round": 1e3 * parts["other"] / rounds,
        "rpc_ms_per_round": 1e3 * parts["client_overhead"] / rounds,
        "measured_tokens_per_second": figures.get("tokens_per_second_total"),
    }


def project(system: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """The projection of one system on one model (see the module docstring)."""
    forward = model["forward"]
    cost_next, extrapolated = cost_at(forward, system["mean_draft_length"] + 1)
    cost_one, _ = cost_at(forward, 1)
    per_round = cost_next + system["overhead_ms_per_round"] / 1e3
    projected = system["tau"] / per_round
    baseline = 1.0 / cost_one
    return {
        "variant": system["variant"],
        "model": model["model"],
        "model_name": model["name"],
        "tau": system["tau"],
        "mean_draft_length": system["mean_draft_length"],
        "overhead_ms_per_round": system["overhead_ms_per_round"],
        "cost_next_ms": cost_next * 1e3,
        "cost_one_ms": cost_one * 1e3,
        "cost_extrapolated": extrapolated,
        "projected_tokens_per_second": projected,
        "baseline_tokens_per_second": baseline,
        "projected_speedup": projected / baseline,
    }


def _same_model(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve() or a == b


def project_all(
    summary: dict[str, dict[str, Any]], cost: dict[str, Any], run_model: str | None = None
) -> list[dict[str, Any]]:
    """One projection per speculative variant of `summary` and measured model of `cost`.

    For the run's own model the measured tokens/s is added, to show the projection's error.
    """
    rows = []
    for name, figures in summary.items():
        system = system_figures(name, figures)
        if system is None:
            continue
        for model in cost["models"]:
            row = project(system, model)
            if run_model is not None and _same_model(model["model"], run_model):
                row["measured_tokens_per_second"] = system["measured_tokens_per_second"]
            rows.append(row)
    return rows


def format_projection(rows: list[dict[str, Any]]) -> str:
    """One line per (variant, model), with the formula on top."""
    if not rows:
        return "projection: no speculative variant in the run"
    lines = [
        "projection on each measured verifier: " + FORMULA,
        f"{'variant':<24}  {'model':<18}  {'tau':>5}  {'L':>5}  {'ovh ms':>6}  "
        f"{'cost(L+1)':>9}  {'tok/s':>8}  {'base':>8}  {'speedup':>7}  {'measured':>8}",
    ]
    lines.append("-" * len(lines[-1]))
    for r in rows:
        measured = r.get("measured_tokens_per_second")
        flag = "*" if r["cost_extrapolated"] else " "
        lines.append(
            f"{r['variant']:<24}  {r['model_name'][:18]:<18}  {r['tau']:5.2f}  "
            f"{r['mean_draft_length']:5.2f}  {r['overhead_ms_per_round']:6.2f}  "
            f"{r['cost_next_ms']:8.3f}{flag}  {r['projected_tokens_per_second']:8.1f}  "
            f"{r['baseline_tokens_per_second']:8.1f}  {r['projected_speedup']:6.2f}x  "
            f"{'-' if measured is None else format(measured, '8.1f'):>8}"
        )
    if any(r["cost_extrapolated"] for r in rows):
        lines.append("* cost extrapolated past the measured new-token counts")
    lines.append("measured = the run's own tokens/s, where the model is the run's model")
    return "\n".join(lines)
