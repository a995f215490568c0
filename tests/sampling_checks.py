"""Checks of sampling exactness shared by the sampling tests: the exact joint law of the first
two generated tokens, computed from the model, and a chi-square test of seeded samples of them."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from scipy.stats import chisquare

from gateway.coordinator import GenerationRequest
from speculant.types import DraftParams

PROMPT = "One day,"
RUNS = 5000
MIN_EXPECTED = 5.0  # chi-square cells with fewer expected samples are pooled


def exact_joint(decoder, prompt_ids: list[int], temperature: float) -> np.ndarray:
    """P[t1, t2] [V, V] of the first two tokens sampled from the model at this temperature."""
    model = decoder.verifier.model.model
    vocab = decoder.verifier.info.vocab_size
    with torch.inference_mode():
        first = model(torch.tensor([prompt_ids])).logits[0, -1].double()  # [V]
        p1 = torch.softmax(first / temperature, -1)  # [V]
        batch = torch.tensor([[*prompt_ids, t] for t in range(vocab)])  # [V, len+1]
        second = model(batch).logits[:, -1].double()  # [V, V]
        p2 = torch.softmax(second / temperature, -1)  # [V(t1), V(t2)]
    return (p1[:, None] * p2).numpy()


def sample_pairs(
    decoder,
    prompt_ids,
    temperature: float,
    strategy: str,
    tree_nodes: int = 0,
    overlay_weight: float = 0.0,
    runs: int = RUNS,
) -> Counter:
    """(first, second) generated token counts over RUNS seeds; tree_nodes > 0: the second
    token comes from verifying a draft tree (one level: up to 3 sibling drafts);
    overlay_weight > 0: drafts mix in the request's own context."""
    counts: Counter = Counter()
    for seed in range(runs):
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=3,
            temperature=temperature,
            seed=seed,
            draft=DraftParams(
                k=4, strategy=strategy, tree_nodes=tree_nodes, overlay_weight=overlay_weight
            ),
        )
        result = decoder.coordinator.generate(request)
        counts[tuple(result.token_ids[:2])] += 1
    return counts


def chi_square_p_value(joint: np.ndarray, counts: Counter) -> float:
    runs = sum(counts.values())
    expected = joint * runs
    cells = np.argwhere(expected >= MIN_EXPECTED)
    observed = [counts.get((int(a), int(b)), 0) for a, b in cells]
    expected_cells = [expected[a, b] for a, b in cells]
    observed.append(runs - sum(observed))  # every other pair, pooled
    expected_cells.append(runs - sum(expected_cells))
    assert len(cells) >= 10, "the prompt should spread its mass over enough pairs"
    return float(chisquare(observed, expected_cells).pvalue)
