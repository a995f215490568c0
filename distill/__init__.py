"""Distillation: teach a graph what the target model says, not only what its corpus says.

A draft pays only when it predicts the *target model's* next tokens. ``speculant distill`` draws
prompts (corpus document prefixes, or a prompts file), lets the target model continue them,
batched, and appends the continuations to the graph as ``speculant build --append`` adds a corpus
(a new version, atomic, locked, hot-reloaded by draft services). Only the continuations' n-grams
are counted (their contexts may reach into the prompt), and the graph's meta records what was
distilled (model fingerprint, generations, tokens, temperature, prompt source).

Modules: :mod:`distill.prompts` (where prompts come from), :mod:`distill.generation` (batched
continuations with Hugging Face ``generate``), :mod:`distill.run` (the whole job),
:mod:`distill.cli` (the commands ``distill`` and ``bench distill``).
"""

from typing import Any

__all__ = ["DistillOptions", "DistillResult", "distill_graph"]


def __getattr__(name: str) -> Any:
    """The job's API, imported on first use (the CLI imports this package at start-up)."""
    if name in __all__:
        from distill import run

        return getattr(run, name)
    raise AttributeError(f"module 'distill' has no attribute {name!r}")
