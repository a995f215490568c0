"""Exactness, sampling under a constraint: speculative decoding samples from the model's
distribution restricted to what the grammar allows (renormalised).

As in test_sampling_exactness, the first two generated tokens after a fixed prompt, over
3,000 seeded runs of the embedded decoder, are compared with their exact joint law by a
chi-square test: P(t1, t2) = p(t1 | prompt, mask_0) * p(t2 | prompt, t1, mask_1(t1)), each p the
model's softmax with the tokens the grammar forbids at that point removed (mask_1 follows t1).
The first token comes from the prefill, the second from verifying a draft. The same test with
the mask skipped at the second position must fail."""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import pytest
import torch

from gateway.generation import GenerationRequest
from speculant.config import DraftParams, SamplingControls
from speculant.constraint import Constraint
from speculant.grammar import ConstraintMatcher, grammars_for
from tests.sampling_checks import PROMPT, RUNS, chi_square_p_value, processed_probs
from verifier_service import sampling

# Lower-case words after a space: most of the model's likeliest first tokens (capitals,
# punctuation, the end) are forbidden, and the second token's mask depends on the first.
CONSTRAINT = Constraint("regex", r"( [a-z]+)+\.")
# A word, then a comma: the second token the model likes best (a space and the next word) is
# forbidden after most first tokens, so a missing mask there shows in a thousand runs.
COMMA = Constraint("regex", r" [a-z]+, [a-z]+")


def constrained_joint(
    decoder, prompt_ids, temperature: float, sampling=None, constraint=CONSTRAINT
) -> np.ndarray:
    """P[t1, t2] [V, V] of the first two tokens under the constraint (see the module)."""
    info = decoder.verifier.info
    grammars = grammars_for(decoder.tokenizer, info.vocab_size, info.eos_token_ids)
    model = decoder.verifier.model.model
    first_mask = grammars.matcher(constraint).allowed()  # [V]
    with torch.inference_mode():
        prompt = torch.tensor([prompt_ids])
        logits = model(prompt).logits[:, -1].masked_fill(~first_mask, float("-inf"))  # [1, V]
        p1 = processed_probs(logits, prompt, temperature, sampling)[0].double()  # [V]
        firsts = first_mask.nonzero().flatten().tolist()
        batch = torch.tensor([[*prompt_ids, t] for t in firsts])  # [F, len+1]
        second = model(batch).logits[:, -1]  # [F, V]
        for row, t in enumerate(firsts):
            matcher = grammars.matcher(constraint)
            matcher.consume([t])
            second[row] = second[row].masked_fill(~matcher.allowed(), float("-inf"))
        p2 = processed_probs(second, batch, temperature, sampling).double()  # [F, V]
    joint = np.zeros((info.vocab_size, info.vocab_size))
    joint[firsts] = (p1[firsts, None] * p2).numpy()
    return joint


def sample_constrained_pairs(
    decoder,
    prompt_ids,
    temperature: float,
    draft: DraftParams,
    sampling=None,
    runs=RUNS,
    constraint=CONSTRAINT,
) -> Counter:
    counts: Counter = Counter()
    for seed in range(runs):
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=3,
            temperature=temperature,
            seed=seed,
            draft=draft,
            sampling=sampling or SamplingControls(),
            constraint=constraint,
        )
        counts[tuple(decoder.coordinator.generate(request).token_ids[:2])] += 1
    return counts


CASES = {
    "sampled drafts": (1.0, DraftParams(k=4, strategy="sampling", tree_nodes=0), None),
    "greedy draft tree": (1.0, DraftParams(k=4, tree_nodes=12, draft_size="fixed"), None),
    "top_k after the mask": (
        1.0,
        DraftParams(k=4, strategy="sampling", tree_nodes=0),
        SamplingControls(top_k=40),
    ),
}
SLOW_CASES = {  # 3,000 runs take about a minute here: the default suite runs one case
    "test_first_two_tokens_follow_the_constrained_model": (
        "greedy draft tree",
        "top_k after the mask",
    )
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_two_tokens_follow_the_constrained_model(embedded_decoder, case):
    temperature, draft, sampling = CASES[case]
    prompt_ids = embedded_decoder.tokenizer(PROMPT).input_ids
    joint = constrained_joint(embedded_decoder, prompt_ids, temperature, sampling)
    counts = sample_constrained_pairs(embedded_decoder, prompt_ids, temperature, draft, sampling)
    p_value = chi_square_p_value(joint, counts)
    assert p_value > 1e-3, f"{case}: sampled pairs do not follow the constrained model"


def test_a_mask_skipped_at_one_position_is_caught(embedded_decoder, monkeypatch):
    """Negative control: the rows of a Verify are not masked from the second position on (a
    walk that forgot to mask them); the matcher is told to accept whatever was emitted."""
    masked = sampling.ConstrainedRows.__call__

    def skipping(self, row):
        if self.matcher.consumed >= 1:  # the second position on
            logits = self._logits[row : row + 1]
            return self._processor.scores(logits, None)[0]
        return masked(self, row)

    consume = ConstraintMatcher.consume

    def lenient(self, token_ids):
        self.consumed = getattr(self, "consumed", 0) + len(token_ids)
        with contextlib.suppress(RuntimeError):  # the forbidden token the skip let through
            consume(self, token_ids)

    monkeypatch.setattr(sampling.ConstrainedRows, "__call__", skipping)
    monkeypatch.setattr(ConstraintMatcher, "consume", lenient)
    monkeypatch.setattr(ConstraintMatcher, "consumed", 0, raising=False)
    temperature, draft, _ = CASES["sampled drafts"]
    prompt_ids = embedded_decoder.tokenizer(PROMPT).input_ids
    joint = constrained_joint(embedded_decoder, prompt_ids, temperature, constraint=COMMA)
    counts = sample_constrained_pairs(
        embedded_decoder, prompt_ids, temperature, draft, runs=1000, constraint=COMMA
    )
    p_value = chi_square_p_value(joint, counts)
    assert p_value < 1e-6, f"the test failed to catch a skipped mask (p = {p_value:.2e})"
