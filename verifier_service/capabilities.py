"""Capability probes of a loaded model, each run once on scratch caches (on the model thread,
see LocalVerifier): whether a batched forward, a draft-tree forward and the lean forward give
the model's true logits. A probe that fails turns the feature off for that model, logged."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from verifier_service.lean_llama import LeanLlama

log = logging.getLogger(__name__)


class ProbedModel(Protocol):
    """What the probes use of a loaded model (verifier_service.model.LoadedModel), named here
    so that this module does not import the one that runs it."""

    name: str
    device: torch.device
    vocab_size: int

    def new_cache(self) -> DynamicCache: ...

    def forward(
        self, cache: DynamicCache, input_ids: torch.Tensor, start: int, logits_to_keep: int
    ) -> torch.Tensor: ...

    def forward_with(self, lean: LeanLlama | None, *args: Any) -> torch.Tensor: ...

    def forward_tree(
        self, cache: DynamicCache, input_ids: torch.Tensor, start: int, parents: list[int]
    ) -> torch.Tensor: ...

    def forward_tree_with(self, lean: LeanLlama | None, *args: Any) -> torch.Tensor: ...

    def forward_batch(
        self, caches: list[DynamicCache], inputs: list[list[int]], starts: list[int]
    ) -> list[torch.Tensor]: ...


# Logits of the same tokens from forwards of other shapes (a batch, a tree, a longer chain)
# differ in their last bits, more so the deeper the model: SmolLM2-135M (30 layers) by up to
# 1.4e-3 on logits of magnitude 32, stories260K (5 layers) by ~1e-5. A probe accepts a
# difference of at most ABS_TOLERANCE or REL_TOLERANCE of the largest logit, whichever is more;
# a wrong mask or position shows as a difference of the logits' own magnitude.
ABS_TOLERANCE = 1e-3
REL_TOLERANCE = 1e-4


def same_logits(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two logit tensors agree within the probes' tolerance (see above)."""
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    limit = max(ABS_TOLERANCE, REL_TOLERANCE * scale)
    return got.shape == expected.shape and float((got - expected).abs().max()) <= limit


def batch_matches_single(model: ProbedModel) -> bool:
    if not all(type(layer) is DynamicLayer for layer in model.new_cache().layers):
        log.warning("verify batching disabled for %s: not a plain dynamic cache", model.name)
        return False
    prompts, inputs = [[1, 2, 3, 4, 5], [1, 6]], [[7, 8], [9, 10, 11]]  # any ids
    singles, caches = [], []
    for prompt in prompts:
        for target in (singles, caches):
            cache = model.new_cache()
            model.forward(cache, torch.tensor(prompt, device=model.device), 0, 1)
            target.append(cache)
    batched = model.forward_batch(caches, inputs, [len(p) for p in prompts])
    after = torch.tensor([12], device=model.device)  # a next token, on the written-back cache
    for single, cache, prompt, new, logits in zip(
        singles, caches, prompts, inputs, batched, strict=True
    ):
        ids, end = torch.tensor(new, device=model.device), len(prompt) + len(new)
        expected = model.forward(single, ids, len(prompt), len(new))
        pairs = [
            (logits, expected),
            (model.forward(cache, after, end, 1), model.forward(single, after, end, 1)),
        ]
        if not all(same_logits(a, b) for a, b in pairs):
            log.warning("verify batching disabled for %s: batched logits differ", model.name)
            return False
    return True


def tree_matches_chains(model: ProbedModel) -> bool:
    prefix = torch.tensor([1, 2, 3], device=model.device)  # any ids: only logits are compared
    drafts, parents = [4, 5, 6], [-1, -1, 1]  # pending 3 -> {4, 5 -> 6}
    cache = model.new_cache()
    model.forward(cache, prefix[:2], 0, 1)
    tree = model.forward_tree(cache, torch.tensor([3, *drafts], device=model.device), 2, parents)
    if not all(hasattr(layer, "keys") for layer in cache.layers):
        return False
    for branch, rows in (([3, 4], [0, 1]), ([3, 5, 6], [0, 2, 3])):
        chain = model.new_cache()
        model.forward(chain, prefix[:2], 0, 1)
        ids = torch.tensor(branch, device=model.device)
        logits = model.forward(chain, ids, 2, len(branch))  # [len(branch), V]
        if not same_logits(logits, tree[rows]):
            log.warning("draft trees disabled for %s: tree logits differ", model.name)
            return False
    return True


def lean_matches_reference(model: ProbedModel, lean: LeanLlama) -> bool:
    """Chains of 1 and 6 tokens and a small tree, each on a cached prefix: the lean forward's
    logits and cache must equal the transformers forward's bit for bit."""
    ids = torch.arange(13, device=model.device) * 7919 % model.vocab_size  # any valid ids
    parents = [-1, -1, 1, 2]
    for case in ("chain1", "chain6", "tree"):
        caches = []
        outputs = []
        for candidate in (None, lean):  # None: the transformers forward
            cache = model.new_cache()
            model.forward_with(candidate, cache, ids[:7], 0, 7)
            if case == "tree":
                outputs.append(model.forward_tree_with(candidate, cache, ids[7:12], 7, parents))
            else:
                n = 1 if case == "chain1" else 6
                outputs.append(model.forward_with(candidate, cache, ids[7 : 7 + n], 7, n))
            caches.append(cache)
        if not torch.equal(outputs[0], outputs[1]):
            return False
        for ref, got in zip(caches[0].layers, caches[1].layers, strict=True):
            if not (torch.equal(ref.keys, got.keys) and torch.equal(ref.values, got.values)):
                return False
    return True
