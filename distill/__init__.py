"""Distillation: teach a graph what the target model says, not only what its corpus says.

A draft pays only when it predicts the *target model's* next tokens. ``speculant distill`` draws
prompts (corpus document prefixes, or a prompts file), lets the target model continue them,
batched, and appends the continuations to the graph as ``speculant build --append`` adds a corpus
(a new version, atomic, locked, hot-reloaded by draft services). Only the continuations' n-grams
are counted (their contexts may reach into the prompt), and the graph's meta records what was
distilled (model fingerprint, generations, tokens, temperature, prompt source). ``speculant
tune`` fits the graph's mixing parameters to the same model, by replaying greedy speculative
decoding against its continuations.

Modules: :mod:`distill.options` (the job's options and their checks), :mod:`distill.prompts`
(where prompts come from), :mod:`distill.generation` (batched continuations with Hugging Face
``generate``, under a prompt's constraint), :mod:`distill.progress` (progress bar or log lines),
:mod:`distill.run` (the whole job, and which prompts it sends), :mod:`distill.cli` (the command
``distill``; ``bench distill`` stands on its flags), :mod:`distill.replay` (greedy speculative
decoding replayed against the model's continuations), :mod:`distill.tune` (the command
``tune``).
"""

from importlib import import_module
from typing import Any

# the job's API: name -> its module
_API = {
    "DistillOptions": "distill.options",
    "DistillResult": "distill.run",
    "distill_graph": "distill.run",
}
__all__ = list(_API)


def __getattr__(name: str) -> Any:
    """The job's API, imported on first use (the CLI imports this package at start-up)."""
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'distill' has no attribute {name!r}")
