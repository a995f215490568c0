"""`speculant bench generate --plot OUT.png`: the run's figures in four panels.

- acceptance by draft position: accepted / drafted at each position, one line per speculative
  variant (all prompts together);
- tokens/s by system: the median over prompts of each variant's tokens/s (bars);
- speedup by system: the ratio of total tokens/s to ``hf``'s (bars), and, when the run has a
  cost section, the projected speedup on the largest measured verifier beside it
  (tau / (cost(L+1) + overhead) against 1 / cost(1); see :mod:`bench.cost`);
- tokens per verifier call (tau) by k: one line per speculative system and mixing, ``hf`` at 1.

matplotlib is optional (``pip install 'speculant-graph[bench]'``); it is imported only here, with
the non-interactive Agg backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECULATIVE = ("embedded", "services")
INSTALL_HINT = "--plot needs matplotlib: pip install 'speculant-graph[bench]' (or matplotlib>=3.8)"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> Any:
    """The pyplot module on the Agg backend, or PlotUnavailable with the install hint."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable(INSTALL_HINT) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _speculative(summary: dict[str, dict]) -> dict[str, dict]:
    return {name: f for name, f in summary.items() if f.get("system") in SPECULATIVE}


def _mix_label(mix: bool | None) -> str:
    return f"mix={'on' if mix else 'off'}"


def _merge(series: list[tuple[str, str, tuple]]) -> list[tuple[str, str, tuple]]:
    """(systems joined by '+', rest of label, points): systems with identical points share a
    line (embedded and services draft and verify alike, so their lines would hide each other)."""
    merged: dict[tuple[str, tuple], list[str]] = {}
    for system, rest, points in series:
        merged.setdefault((rest, points), []).append(system)
    return [("+".join(systems), rest, points) for (rest, points), systems in merged.items()]


def _plot_acceptance(ax: Any, summary: dict[str, dict]) -> None:
    series = []
    for f in _speculative(summary).values():
        values = f.get("acceptance_by_position") or []
        points = tuple((i + 1, v) for i, v in enumerate(values) if v is not None)
        series.append((f["system"], f"k={f['k']} {_mix_label(f.get('mix'))}", points))
    for systems, rest, points in _merge(series):
        style = "--" if rest.endswith("off") else "-"
        xs, ys = [x for x, _ in points], [y for _, y in points]
        ax.plot(xs, ys, style, marker="o", markersize=3, label=f"{systems} {rest}")
    ax.set_title("acceptance by draft position (accepted / drafted, all prompts)")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _bar_labels(ax: Any, bars: Any, spec: str) -> None:
    labels = [format(b.get_height(), spec) if b.get_height() else "" for b in bars]
    ax.bar_label(bars, labels=labels, fontsize=7)


def _plot_tokens_per_second(ax: Any, summary: dict[str, dict]) -> None:
    names = list(summary)
    values = [summary[n].get("tokens_per_second_median") or 0.0 for n in names]
    bars = ax.bar(range(len(names)), values, color="tab:blue")
    _bar_labels(ax, bars, ".0f")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=7)
    ax.set_title("tokens/s by system (median over prompts)")
    ax.set_ylabel("tokens/s")
    ax.grid(axis="y", alpha=0.3)


def _largest_projection(result: dict[str, Any]) -> tuple[str, dict[str, float]] | None:
    """(model name, {variant: projected speedup}) for the largest measured model."""
    cost = result.get("cost")
    rows = result.get("projection")
    if not cost or not rows:
        return None
    largest = max(cost["models"], key=lambda m: m["parameters"])
    values = {r["variant"]: r["projected_speedup"] for r in rows if r["model"] == largest["model"]}
    return largest["name"], values


def _plot_speedup(ax: Any, result: dict[str, Any]) -> None:
    summary = result["summary"]
    names = list(summary)
    xs = range(len(names))
    projection = _largest_projection(result)
    width = 0.4 if projection else 0.8
    measured = [summary[n].get("speedup_total") or 0.0 for n in names]
    left = [x - width / 2 if projection else x for x in xs]
    label = "measured: total tok/s / hf's"
    bars = ax.bar(left, measured, width, color="tab:green", label=label)
    _bar_labels(ax, bars, ".2f")
    if projection:
        model, values = projection
        projected = [values.get(n, 0.0) for n in names]
        label = f"projected on {model}: tau / (cost(L+1) + overhead) vs 1 / cost(1)"
        right = [x + width / 2 for x in xs]
        bars = ax.bar(right, projected, width, color="tab:orange", label=label)
        _bar_labels(ax, bars, ".2f")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), names, rotation=35, ha="right", fontsize=7)
    ax.set_title("speedup over hf generate")
    ax.set_ylabel("speedup (x)")
    ax.set_ylim(0, 1.3 * max([*measured, *(projection[1].values() if projection else []), 1.0]))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", ncol=2)


def _plot_tau_by_k(ax: Any, summary: dict[str, dict]) -> None:
    by_system: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for f in _speculative(summary).values():
        key = (f["system"], _mix_label(f.get("mix")))
        by_system.setdefault(key, []).append((f["k"], f["tau_total"] or 0.0))
    series = [(system, rest, tuple(sorted(pts))) for (system, rest), pts in by_system.items()]
    for systems, rest, points in _merge(series):
        style = "--" if rest.endswith("off") else "-"
        xs, ys = [k for k, _ in points], [t for _, t in points]
        ax.plot(xs, ys, style, marker="o", label=f"{systems} {rest}")
    lookup = [f for f in summary.values() if f.get("system") == "hf-lookup"]
    for f in lookup:
        ax.plot([f["k"]], [f["tau_total"]], "s", color="black", label=f"hf-lookup k={f['k']}")
    if "hf" in summary:
        ax.axhline(summary["hf"]["tau_total"] or 1.0, color="gray", linestyle=":", label="hf")
    ks = sorted({f["k"] for f in summary.values() if f.get("k") is not None})
    ax.set_xticks(ks)
    ax.set_title("tokens per verifier call (tau) by k")
    ax.set_xlabel("k (max draft tokens)")
    ax.set_ylabel("tokens / verifier forward")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _title(result: dict[str, Any]) -> str:
    s = result["settings"]
    machine = result.get("machine", {})
    prompts = next(iter(result["summary"].values()))["prompts"] if result["summary"] else 0
    return (
        f"{Path(s['model']).name}: {prompts} prompts x {s['max_tokens']} tokens, "
        f"temperature {s['temperature']}, {s['strategy']} drafts; "
        f"{machine.get('cpu_count')} CPUs, {machine.get('torch_threads')} torch thread(s)"
    )


def write_plot(result: dict[str, Any], path: str | Path) -> Path:
    """Draw the four panels of a `run_benchmark` result (with its cost section, if any)."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    try:
        _plot_acceptance(axes[0][0], result["summary"])
        _plot_tokens_per_second(axes[0][1], result["summary"])
        _plot_speedup(axes[1][0], result)
        _plot_tau_by_k(axes[1][1], result["summary"])
        fig.suptitle(_title(result), fontsize=10)
        fig.tight_layout()
        out = Path(path)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out
