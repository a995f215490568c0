"""What ``speculant tune`` and ``speculant bench distill`` report alike of their replays
(:mod:`bench.greedy_sim`): the drafts replayed, progress of the greedy continuations, and the
per-kind groups of the prompt records: a record's *kind* is its optional ``kind`` field
(:mod:`speculant.prompt_records`); its *label* is the group it is counted in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from speculant.config import DraftParams
from speculant.prompt_records import PromptRecord, kinds_of

NO_KIND = "(none)"  # the group of records without a kind, when others have one


def kind_labels(prompts: Sequence[PromptRecord]) -> list[str]:
    """Each prompt's group for the per-kind figures: "" for all when no record has a kind,
    else its kind (NO_KIND for a record without one)."""
    if not kinds_of(prompts):
        return ["" for _ in prompts]
    return [prompt.kind or NO_KIND for prompt in prompts]


def kinds_in(labels: Sequence[str]) -> list[str]:
    """The groups among labels, in the order first seen (none when no record has a kind)."""
    return list(dict.fromkeys(label for label in labels if label))


def replayed_drafts(params: DraftParams) -> dict[str, Any]:
    """The drafts of replays with every drafted token verified, as reports record them."""
    return {
        "k": params.k,
        "tree_nodes": params.tree_nodes,
        "overlay_weight": params.overlay_weight,
        "verified": "every drafted token (a flat cost profile)",
    }


def every_8(say: Callable[[str], None], what: str) -> Callable[[int, int], None]:
    """A progress(done, total) for :func:`bench.greedy_sim.greedy_traces` that says
    "what: done/total" after every 8th prompt and the last."""

    def report(done: int, total: int) -> None:
        if done % 8 == 0 or done == total:
            say(f"{what}: {done}/{total}")

    return report
