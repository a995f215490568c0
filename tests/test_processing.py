"""The target processor (verifier_service.sampling) against Hugging Face's own logits processors,
on random logits and histories: the scores it samples from are the ones generate would."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from speculant.config import SamplingControls
from speculant.errors import InvalidArgumentError
from verifier_service.sampling import TargetProcessor, history_counts

VOCAB = 64
CONTROLS = [
    SamplingControls(top_k=5),
    SamplingControls(top_p=0.7),
    SamplingControls(min_p=0.1),
    SamplingControls(repetition_penalty=1.5),
    SamplingControls(repetition_penalty=0.7, top_k=10, top_p=0.9, min_p=0.05),
]


def hf_scores(logits: torch.Tensor, history: list[int], c: SamplingControls, temperature: float):
    """Hugging Face's processed scores [V] for one position after `history`."""
    processors = LogitsProcessorList()
    if c.repetition_penalty not in (None, 1.0):
        processors.append(RepetitionPenaltyLogitsProcessor(c.repetition_penalty))
    if temperature > 0:
        processors.append(TemperatureLogitsWarper(temperature))
        if c.top_k:
            processors.append(TopKLogitsWarper(c.top_k))
        if c.top_p not in (None, 1.0):
            processors.append(TopPLogitsWarper(c.top_p))
        if c.min_p:
            processors.append(MinPLogitsWarper(c.min_p))
    return processors(torch.tensor([history]), logits[None].clone())[0]


def test_no_controls_pass_the_logits_through():
    logits = torch.randn(3, VOCAB)
    processor = TargetProcessor(SamplingControls().resolved(), 0.7)
    assert processor.identity and processor.sampling_temperature == 0.7
    assert processor.scores(logits, None) is logits


@pytest.mark.parametrize("temperature", [0.0, 0.8, 1.0])
@pytest.mark.parametrize("controls", CONTROLS, ids=lambda c: repr(c.set_fields()))
def test_scores_match_hugging_face(controls, temperature):
    generator = torch.Generator().manual_seed(7)
    logits = 3 * torch.randn(5, VOCAB, generator=generator)  # [rows, V]
    cached = torch.randint(0, VOCAB, (12,), generator=generator).tolist()
    row_tokens = torch.randint(0, VOCAB, (5,), generator=generator)  # [pending, d_1..d_4]
    base = torch.bincount(torch.tensor(cached), minlength=VOCAB).float()
    processor = TargetProcessor(controls.resolved(), temperature)
    ours = processor.scores(logits, history_counts(base, row_tokens, None))
    for row in range(5):
        history = cached + row_tokens[: row + 1].tolist()
        expected = torch.softmax(hf_scores(logits[row], history, controls, temperature or 1.0), -1)
        if temperature == 0:  # greedy: the argmax of the penalised logits
            assert int(ours[row].argmax()) == int(
                hf_scores(logits[row], history, controls, 0).argmax()
            )
        else:
            torch.testing.assert_close(torch.softmax(ours[row], -1), expected, atol=1e-6, rtol=0)


def test_presence_and_frequency_penalties_count_the_history():
    logits = torch.zeros(1, 4)
    counts = torch.tensor([[0.0, 1.0, 3.0, 0.0]])
    controls = SamplingControls(presence_penalty=0.5, frequency_penalty=0.25).resolved()
    scores = TargetProcessor(controls, 0.0).scores(logits, counts)
    assert scores.tolist() == [[0.0, -0.75, -1.25, 0.0]]


def test_tree_rows_count_their_own_ancestors_only():
    base = torch.zeros(6)
    input_ids = torch.tensor([0, 1, 2, 3])  # pending 0; d0 = 1 and d1 = 2 children of it
    counts = history_counts(base, input_ids, parents=[-1, -1, 0])  # d2 = 3 child of d0
    assert counts.tolist() == [
        [1, 0, 0, 0, 0, 0],  # after the pending token
        [1, 1, 0, 0, 0, 0],  # after d0
        [1, 0, 1, 0, 0, 0],  # after d1: d0 is not on its path
        [1, 1, 0, 1, 0, 0],  # after d2: d0, d2
    ]


def test_model_defaults_fill_unset_controls_only():
    defaults = {"repetition_penalty": 1.3, "top_k": 40}
    resolved = SamplingControls(top_k=5).resolved(defaults)
    assert resolved.top_k == 5 and resolved.repetition_penalty == 1.3 and resolved.top_p == 1.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", -0.1),
        ("repetition_penalty", 0.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", float("nan")),
    ],
)
def test_out_of_range_controls_name_the_field(field, value):
    with pytest.raises(InvalidArgumentError, match=f"^{field}: "):
        SamplingControls(**{field: value}).validate()
