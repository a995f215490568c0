"""Measure mixing modes end to end (embedded, against HF generate).

    python -m bench.mixing --graph G --model M [--k 8]
        [--mixing seed,backoff,witten-bell] [--escape-weight 1,8]
        [--overlay-weight 0,1,4] [--tree-nodes 0,12]
        [--limit N] [--json OUT]

Every prompt runs through Hugging Face ``generate`` (the baseline) and through one embedded
coordinator per variant (mixing x escape_weight (witten-bell only) x overlay_weight x
tree_nodes, each with its own Drafter so that step caches are not shared), in an order rotated
prompt by prompt, after a warm-up prompt. The figures are
those of ``speculant bench generate`` (:mod:`bench.generate`, whose helpers this reuses):

- tau = generated tokens / verifier forwards (prefill included); ``tau`` is the total ratio;
- speedup = tokens/s over HF's on the same prompt (median over prompts) and of the totals;
- drafted = draft tokens sent to the verifier, wasted = drafted - accepted (the verifier paid for
  them and threw them away), mean draft length = drafted / draft rounds;
- mismatches = prompts whose output differs from HF's (must be 0 at temperature 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.generate import rotated
from bench.in_process import InProcessSystems
from bench.settings import (
    BenchSettings,
    RunRecord,
    Variant,
    default_prompts_path,
    load_prompt_texts,
)
from bench.summary import per_prompt_values, summarize_variant
from speculant.config import DEFAULT_TREE_NODES, MIXING_MODES, DraftParams


@dataclass(frozen=True)
class MixVariant:
    """One embedded row: k, mixing mode, escape weight, overlay weight and tree size."""

    k: int
    mixing: str
    escape_weight: float = 1.0
    overlay_weight: float = 0.0
    tree_nodes: int = DEFAULT_TREE_NODES

    @property
    def name(self) -> str:
        mode = self.mixing
        if mode == "witten-bell":
            mode = f"wb b={self.escape_weight:g}"
        overlay = f" ov={self.overlay_weight:g}" if self.overlay_weight else ""
        tree = f" tree={self.tree_nodes}" if self.params().drafts_tree else ""
        return f"k={self.k} {mode}{overlay}{tree}"

    def params(self) -> DraftParams:
        return DraftParams(
            k=self.k,
            mixing=self.mixing,
            escape_weight=self.escape_weight,
            overlay_weight=self.overlay_weight,
            tree_nodes=self.tree_nodes,
        ).validate()


def _run_variant(
    systems: InProcessSystems, coordinators: dict, variant: MixVariant, ids: list[int], seed: int
) -> RunRecord:
    """One embedded generation of variant on a tokenized prompt."""
    if variant not in coordinators:
        from draft_service.drafting import Drafter

        coordinators[variant] = systems.new_coordinator(Drafter(systems.decoder.graph))
    request = systems.request(ids, seed, draft=variant.params())
    return systems.generate(coordinators[variant], request)


def run(settings: BenchSettings, variants: list[MixVariant]) -> dict[str, Any]:
    """Every variant and HF on every prompt, interleaved; the summary per variant."""
    import torch

    torch.set_num_threads(settings.torch_threads)
    prompts = load_prompt_texts(settings.prompts, settings.limit)
    systems = InProcessSystems(settings)
    prompt_ids = [systems.encode(p) for p in prompts]
    coordinators: dict[MixVariant, Any] = {}
    hf = Variant("hf")
    rows: list[Any] = [hf, *variants]

    def call(row: Any, ids: list[int], seed: int) -> RunRecord:
        if row == hf:
            return systems.run_hf(hf, ids, seed)
        return _run_variant(systems, coordinators, row, ids, seed)

    for row in rows:  # warm-up
        call(row, prompt_ids[0], settings.seed)
    records: dict[Any, list[list[RunRecord]]] = {row: [] for row in rows}
    for i, ids in enumerate(prompt_ids):
        for row in rotated(rows, i):
            records[row].append([call(row, ids, settings.seed + i)])
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    systems.close()
    summary: dict[str, dict] = {}
    for row in rows:
        per_prompt = [
            per_prompt_values(recs, records[hf][i] if row != hf else None)
            for i, recs in enumerate(records[row])
        ]
        figures = summarize_variant(per_prompt, settings.temperature)
        if row != hf:
            figures |= _draft_figures(per_prompt)
        summary["hf" if row == hf else row.name] = figures
    base = summary["hf"]["tokens_per_second_total"]
    for figures in summary.values():
        figures["speedup_total"] = figures["tokens_per_second_total"] / base
    return {"settings": asdict(settings), "summary": summary}


def _draft_figures(per_prompt: list[dict]) -> dict[str, Any]:
    """drafted, wasted (= drafted - accepted) and the mean draft length per draft round."""
    drafted = sum(r["draft_tokens"] for r in per_prompt)
    accepted = sum(r["accepted_tokens"] for r in per_prompt)
    draft_rounds = sum(r["rounds"] for r in per_prompt) - len(per_prompt)  # minus the prefills
    by_source = {
        source: sum(r.get(f"accepted_from_{source}", 0) for r in per_prompt)
        for source in ("graph", "overlay", "both")
    }
    return {
        "accepted_by_source": by_source,
        "drafted_total": drafted,
        "wasted_total": drafted - accepted,
        "mean_draft_length": drafted / draft_rounds if draft_rounds else None,
    }


def format_table(summary: dict[str, dict]) -> str:
    """One line per variant."""
    header = (
        f"{'variant':28} {'tau':>5} {'speedup':>7} {'sp.tot':>6} {'tok/s':>6} {'accept':>6} "
        f"{'len':>5} {'drafted':>7} {'wasted':>7} {'mism':>4}  acceptance by position"
    )
    lines = [header, "-" * len(header)]
    for name, f in summary.items():
        by_pos = " ".join(f"{a:.2f}" for a in f.get("acceptance_by_position") or [])
        lines.append(
            f"{name:28} {f['tau_total']:5.2f} {f['speedup_median'] or 1.0:7.2f} "
            f"{f['speedup_total']:6.2f} {f['tokens_per_second_total']:6.0f} "
            f"{f.get('acceptance_rate_total') or 0:6.1%} {f.get('mean_draft_length') or 0:5.2f} "
            f"{f.get('drafted_total', 0):7d} {f.get('wasted_total', 0):7d} "
            f"{f.get('exact_mismatches') or 0:4d}  {by_pos}"
        )
    return "\n".join(lines)


def _csv(kind: type) -> Any:
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graph", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", default=str(default_prompts_path()))
    p.add_argument("--k", type=_csv(int), default=[8])
    p.add_argument("--mixing", type=_csv(str), default=list(MIXING_MODES))
    p.add_argument("--escape-weight", type=_csv(float), default=[1.0], help="witten-bell only")
    p.add_argument(
        "--overlay-weight", type=_csv(float), default=[0.0], help="context overlay (0 = off)"
    )
    p.add_argument(
        "--tree-nodes",
        type=_csv(int),
        default=[DEFAULT_TREE_NODES],
        help=f"draft tree sizes (0 = a chain of k; default {DEFAULT_TREE_NODES})",
    )
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    settings = BenchSettings(
        graph=args.graph,
        model=args.model,
        prompts=args.prompts,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        limit=args.limit,
        systems=("hf", "embedded"),
    )
    variants = [
        MixVariant(k, mixing, weight, overlay, tree)
        for k in args.k
        for mixing in args.mixing
        for weight in (args.escape_weight if mixing == "witten-bell" else [1.0])
        for overlay in args.overlay_weight
        for tree in args.tree_nodes
    ]
    for variant in variants:
        variant.params()  # fail fast on a bad mode
    result = run(settings, variants)
    print(format_table(result["summary"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
