"""The tables `speculant bench generate` prints."""

from __future__ import annotations

from typing import Any


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return format(value * scale if scale != 1.0 else value, spec)


TABLE_COLUMNS = (
    ("variant", 24, None, ""),
    ("tok/s", 7, "tokens_per_second_median", ".0f"),
    ("total", 7, "tokens_per_second_total", ".1f"),
    ("speedup", 7, "speedup_median", ".2f"),
    ("vs plain", 8, "speedup_over_plain_total", ".2f"),
    ("tau", 5, "tau_median", ".2f"),
    ("accept", 6, "acceptance_rate_total", ".1%"),
    ("draft ms", 8, "draft_seconds_median", ".1f"),
    ("verify ms", 9, "verify_seconds_median", ".1f"),
    ("other ms", 8, "other_seconds_median", ".1f"),
    ("rpc ms", 6, "client_overhead_seconds_median", ".1f"),
    ("wasted", 6, "wasted_draft_tokens", "d"),
    ("mismatch", 8, "exact_mismatches", "d"),
)
# Added where prompts are constrained (see bench.constrained): the forced share, and how many
# answers finished and are valid.
CONSTRAINED_COLUMNS = (
    ("forced", 6, "forced_share_total", ".1%"),
    ("finished", 8, "answers_finished", "d"),
    ("valid", 5, "answers_valid", "d"),
)


def format_table(result: dict[str, Any]) -> str:
    """One row per variant: medians over prompts (accept: total over prompts); then, when the
    prompts have kinds, the same table for each kind."""
    title = "medians over prompts of per-prompt values; accept = accepted / drafted, all prompts"
    tables = [_table(title, result["summary"])]
    for kind, summary in result.get("by_kind", {}).items():
        prompts = next(iter(summary.values()))["prompts"]
        tables.append(_table(f"kind {kind!r} ({prompts} prompts)", summary))
    return "\n\n".join(tables)


def _table(title: str, summary: dict[str, Any]) -> str:
    columns = TABLE_COLUMNS
    constrained = max((f.get("constrained_prompts", 0) for f in summary.values()), default=0)
    if constrained:
        columns += CONSTRAINED_COLUMNS
        title += f"; {constrained} constrained prompts (forced = accepted_from_grammar / tokens)"
    first = max([columns[0][1], *(len(name) for name in summary)])  # the variants' names
    header = "  ".join(
        name.rjust(width) if i else name.ljust(first)
        for i, (name, width, _, _) in enumerate(columns)
    )
    lines = [title, header, "-" * len(header)]
    for name, figures in summary.items():
        cells = [name.ljust(first)]
        for _, width, key, spec in columns[1:]:
            scale = 1e3 if key and key.endswith("seconds_median") else 1.0
            cells.append(_fmt(figures.get(key), spec, scale).rjust(width))
        lines.append("  ".join(cells))
    return "\n".join(lines)


def format_footer(result: dict[str, Any]) -> str:
    """Totals, acceptance by position, memory and machine lines under the table."""
    lines = []
    for name, f in result["summary"].items():
        extra = ""
        if f.get("acceptance_by_position"):
            by_pos = " ".join(_fmt(a, ".2f") for a in f["acceptance_by_position"])
            wasted = f.get("wasted_draft_tokens", "-")  # drafted - accepted
            extra = f"; wasted draft tokens {wasted}; acceptance by position {by_pos}"
        lines.append(
            f"{name}: total {_fmt(f['tokens_per_second_total'], '.0f')} tok/s, "
            f"speedup {_fmt(f.get('speedup_total'), '.2f')}x, tau {_fmt(f['tau_total'], '.2f')}"
            f"{extra}"
        )
    for label, figures in result.get("learning", {}).items():
        restart = (
            f", {figures['documents_after_restart']} replayed after a restart"
            if "documents_after_restart" in figures
            else ""
        )
        lines.append(
            f"learning ({label}): {figures['learned_documents']} generations learned in "
            f"{figures['warmup_seconds']} s warm-up, live layer "
            f"{figures['live_layer_bytes'] / 2**20:.1f} MiB{restart}"
        )
    mem = result["memory"]
    rss = [f"bench {mem['bench_process_peak_rss_bytes'] / 2**20:.0f} MiB"]
    for name, info in mem["services"].items():
        peak = info.get("peak_rss_bytes") or info.get("rss_bytes") or 0
        rss.append(f"{name} {peak / 2**20:.0f} MiB (OMP_NUM_THREADS={info.get('omp_num_threads')})")
    machine = result["machine"]
    lines.append("peak RSS: " + ", ".join(rss))
    if "services" in result["settings"]["systems"]:
        how = result["settings"].get("services_as", "bench")
        lines.append(f"services started as: {how}")
        lines += [f"  {note}" for note in result.get("services_chosen", [])]
    lines.append(
        f"machine: {machine['cpu_count']} CPUs, torch {machine['torch']} with "
        f"{machine['torch_threads']} thread(s), load average {machine['load_average_start']} at "
        f"start, {machine['load_average_end']} at end, {machine['bench_seconds']} s"
    )
    return "\n".join(lines)


# --- command line --------------------------------------------------------------------------
