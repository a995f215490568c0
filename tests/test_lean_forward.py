"""The lean Llama forward (verifier_service.lean_llama) against the transformers forward.

It may only ever change speed: for the stories260K model its logits and KV cache must equal the
transformers forward's bit for bit, on real prompts, chunk after chunk, for chains and trees;
the load-time check must refuse a lean forward that is off by the smallest amount; models it
does not reproduce keep the transformers forward.
"""

from __future__ import annotations

import copy
import random

import torch

from speculant.tokenizer import load_tokenizer
from tests.assets import STORIES_MODEL, load_dev_prompts
from verifier_service.lean_llama import LeanLlama
from verifier_service.model import LoadedModel, lean_matches_reference


def _twin(loaded: LoadedModel, use_lean: bool) -> LoadedModel:
    """The same model and weights, with the lean forward on or off."""
    return LoadedModel.from_model(loaded.model, loaded.tokenizer, use_lean=use_lean)


def _assert_same_cache(a, b) -> None:  # DynamicCache, DynamicCache
    for left, right in zip(a.layers, b.layers, strict=True):
        assert torch.equal(left.keys, right.keys) and torch.equal(left.values, right.values)


def test_lean_forward_is_on_for_stories260k(loaded: LoadedModel) -> None:
    assert loaded.lean is not None
    assert _twin(loaded, use_lean=False).lean is None


def test_chunked_chains_match_the_transformers_forward_bit_for_bit(loaded: LoadedModel) -> None:
    lean, reference = _twin(loaded, True), _twin(loaded, False)
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    rng = random.Random(0)
    for prompt in load_dev_prompts(6):
        ids = torch.tensor(tokenizer(prompt)["input_ids"])
        ids = torch.cat([ids, torch.randint(0, loaded.vocab_size, (40,))])  # [n]
        caches = (lean.new_cache(), reference.new_cache())
        start = 0
        while start < len(ids):
            n = min(len(ids) - start, rng.choice([1, 2, 5, 9, 17]))
            chunk = ids[start : start + n]
            got = lean.forward(caches[0], chunk, start, n)
            want = reference.forward(caches[1], chunk, start, n)
            assert torch.equal(got, want), f"logits differ at {start}+{n}"
            start += n
            if rng.random() < 0.3 and start > 4:  # roll back a rejected tail, as verify does
                start -= rng.randint(1, 3)
                lean.crop(caches[0], start)
                reference.crop(caches[1], start)
        _assert_same_cache(*caches)


def test_trees_match_the_transformers_forward_bit_for_bit(loaded: LoadedModel) -> None:
    lean, reference = _twin(loaded, True), _twin(loaded, False)
    ids = torch.randint(0, loaded.vocab_size, (40,), generator=torch.Generator().manual_seed(1))
    parents = [-1, -1, 0, 0, 1, 2, 4, 6]  # pending -> {0 -> {2 -> 5, 3}, 1 -> 4 -> 6 -> 7}
    caches = (lean.new_cache(), reference.new_cache())
    for model, cache in zip((lean, reference), caches, strict=True):
        model.forward(cache, ids[:30], 0, 1)
    tree_ids = ids[30 : 31 + len(parents)]
    got = lean.forward_tree(caches[0], tree_ids, 30, parents)
    want = reference.forward_tree(caches[1], tree_ids, 30, parents)
    assert torch.equal(got, want)
    for model, cache in zip((lean, reference), caches, strict=True):
        model.keep_path(cache, 30, (1, 4, 6))
    _assert_same_cache(*caches)


def test_the_load_time_check_refuses_a_lean_forward_that_is_slightly_off(
    loaded: LoadedModel,
) -> None:
    twin = _twin(loaded, True)
    lean = LeanLlama.for_model(twin.model)
    assert lean is not None and lean_matches_reference(twin, lean)
    lean.eps *= 1.0001  # a negative control: the smallest change must be caught
    assert not lean_matches_reference(twin, lean)


def test_configurations_it_does_not_reproduce_keep_the_transformers_forward(
    loaded: LoadedModel,
) -> None:
    for change in ({"attention_bias": True}, {"hidden_act": "gelu"}):
        model = copy.deepcopy(loaded.model)
        for key, value in change.items():
            setattr(model.config, key, value)
        assert LeanLlama.for_model(model) is None, change
    eager = copy.deepcopy(loaded.model)
    eager.config._attn_implementation = "eager"
    assert LeanLlama.for_model(eager) is None
