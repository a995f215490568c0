"""Checks of sampling exactness shared by the sampling tests: the exact law of the first two
generated tokens, computed from the model with Hugging Face's own logits processors, seeded
samples of them (embedded or over a gateway), and a chi-square test of those samples.

*Processed* distribution p at a position (what ``generate(do_sample=True, ...)`` samples from):
the model's logits, then in Hugging Face ``generate``'s order RepetitionPenaltyLogitsProcessor,
OpenAI's presence/frequency penalties (logit -= frequency * count + presence * [count > 0]),
TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper, the penalties
counting the *history* (the prompt and every token before the position). The processors run in
the model's dtype (float32), as in generate, so that which tokens survive top_k/top_p/min_p is
decided exactly as generate decides it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from gateway.generation import GenerationRequest
from speculant.config import DraftParams

PROMPT = "One day,"
RUNS = 3000  # seeded runs per chi-square test (the acceptance asks >= 3,000)
MIN_EXPECTED = 5.0  # chi-square cells with fewer expected samples are pooled


def _control(sampling, name: str, off: float) -> float:
    """A control's value (a SamplingControls-like object, or None: every control off)."""
    value = getattr(sampling, name, None) if sampling is not None else None
    return off if value is None else value


def openai_penalties(
    history: torch.Tensor, scores: torch.Tensor, presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI's presence/frequency penalties. history [B, L] token ids, scores [B, V] -> [B, V]:
    score -= frequency * count + presence * [count > 0], count = occurrences in the history."""
    counts = torch.zeros_like(scores)  # [B, V]
    counts.scatter_add_(1, history, torch.ones_like(history, dtype=scores.dtype))
    return scores - frequency * counts - presence * (counts > 0).to(scores.dtype)


def hf_processors(temperature: float, sampling) -> list:
    """The processing steps of p, in generate's order (OpenAI's penalties as a callable after
    the repetition penalty); temperature 0: the penalties only (greedy takes their argmax)."""
    steps: list = []
    repetition = _control(sampling, "repetition_penalty", 1.0)
    if repetition != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(repetition))
    presence = _control(sampling, "presence_penalty", 0.0)
    frequency = _control(sampling, "frequency_penalty", 0.0)
    if presence or frequency:
        steps.append(lambda ids, scores: openai_penalties(ids, scores, presence, frequency))
    if temperature == 0:
        return steps
    steps.append(TemperatureLogitsWarper(temperature))
    if top_k := _control(sampling, "top_k", 0):
        steps.append(TopKLogitsWarper(int(top_k)))
    if (top_p := _control(sampling, "top_p", 1.0)) < 1.0:
        steps.append(TopPLogitsWarper(top_p))
    if min_p := _control(sampling, "min_p", 0.0):
        steps.append(MinPLogitsWarper(min_p))
    return steps


def processed_log_probs(
    logits: torch.Tensor, history: torch.Tensor, temperature: float, sampling=None
) -> torch.Tensor:
    """log p [B, V] (float64) of the processed distribution. logits [B, V] in the model's dtype;
    history [B, L]: row b's prompt and tokens before the position. Temperature 0: the log-softmax
    of the penalised logits (what a greedy request reports as its logprobs)."""
    scores = logits.clone()
    for step in hf_processors(temperature, sampling):
        scores = step(history, scores)
    return torch.log_softmax(scores.double(), dim=-1)


def processed_probs(
    logits: torch.Tensor, history: torch.Tensor, temperature: float, sampling=None
) -> torch.Tensor:
    """p [B, V] (float64): see processed_log_probs (temperature > 0)."""
    return processed_log_probs(logits, history, temperature, sampling).exp()


def model_joint(
    model,
    prompt_ids: list[int],
    temperature: float,
    sampling=None,
    second_sampling=...,
) -> np.ndarray:
    """P[t1, t2] [V, V] of the first two tokens sampled from the model with these controls; the
    second token's history is the prompt and t1. second_sampling (default: the same) processes
    the second token differently: the negative controls use it to show that a wrong second
    token (a wrongly verified one) would be caught."""
    second = sampling if second_sampling is ... else second_sampling
    with torch.inference_mode():
        prompt = torch.tensor([prompt_ids])  # [1, len]
        first = model(prompt).logits[:, -1]  # [1, V]
        p1 = processed_probs(first, prompt, temperature, sampling)[0]  # [V]
        vocab = first.shape[-1]
        batch = torch.tensor([[*prompt_ids, t] for t in range(vocab)])  # [V, len+1]
        logits = model(batch).logits[:, -1]  # [V(t1), V(t2)]
        p2 = processed_probs(logits, batch, temperature, second)  # [V(t1), V(t2)]
    return (p1[:, None] * p2).numpy()


def exact_joint(decoder, prompt_ids: list[int], temperature: float, sampling=None) -> np.ndarray:
    """P[t1, t2] [V, V] of the first two tokens sampled from the decoder's model (see
    model_joint; sampling None: plain softmax(logits / temperature))."""
    return model_joint(decoder.verifier.model.model, prompt_ids, temperature, sampling)


@dataclass
class PairSample:
    """Seeded samples of the first two generated tokens.

    counts: (first, second) -> runs; drafted: runs whose second token was decided by verifying a
    non-empty draft (the second round's draft_tokens > 0); accepted: runs where that draft was
    accepted (so the second token is the draft; the others' is a correction)."""

    counts: Counter
    drafted: int = 0
    accepted: int = 0

    @property
    def runs(self) -> int:
        return sum(self.counts.values())

    def first_tokens(self) -> Counter:
        """(first,) -> runs: the first token's counts."""
        firsts: Counter = Counter()
        for (first, _), n in self.counts.items():
            firsts[(first,)] += n
        return firsts


def draw_pairs(
    generate_one: Callable[[int], tuple[list[int], int, int]], runs: int, workers: int = 1
) -> PairSample:
    """generate_one(seed) -> (generated token ids, draft tokens, accepted drafts) of a request
    with max_tokens=3 (so its second round verifies one draft position), for seeds 0..runs-1;
    workers > 1: that many requests at a time (seeded requests do not depend on their order)."""
    sample = PairSample(Counter())
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(generate_one, range(runs)))
    for token_ids, drafted, accepted in outcomes:
        sample.counts[tuple(token_ids[:2])] += 1
        sample.drafted += drafted > 0
        sample.accepted += accepted > 0
    return sample


def sample_pairs_embedded(
    decoder,
    prompt_ids: list[int],
    temperature: float,
    draft: DraftParams,
    sampling=None,
    runs: int = RUNS,
) -> PairSample:
    """The first two tokens of `runs` seeded requests of the embedded coordinator."""
    extra = {} if sampling is None else {"sampling": sampling}

    def generate_one(seed: int) -> tuple[list[int], int, int]:
        request = GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=3,
            temperature=temperature,
            seed=seed,
            draft=draft,
            **extra,
        )
        result = decoder.coordinator.generate(request)
        return result.token_ids, result.stats.draft_tokens, result.stats.accepted_tokens

    return draw_pairs(generate_one, runs)


def sample_pairs_over_gateway(
    stub,
    prompt_ids: list[int],
    temperature: float,
    draft,
    sampling,
    runs: int = RUNS,
    workers: int = 4,
) -> PairSample:
    """The same through a gateway's Generate (draft: common_pb2.DraftOptions, sampling:
    common_pb2.SamplingControls), the prompt sent as token ids, `workers` requests at a time."""
    from speculant.v1 import gateway_pb2

    def generate_one(seed: int) -> tuple[list[int], int, int]:
        request = gateway_pb2.GenerateRequest(
            prompt_token_ids=prompt_ids,
            max_tokens=3,
            temperature=temperature,
            seed=seed,
            draft=draft,
            sampling=sampling,
        )
        response = stub.Generate(request, timeout=60)
        stats = response.stats
        return list(response.token_ids), stats.draft_tokens, stats.accepted_tokens

    return draw_pairs(generate_one, runs, workers)


def sample_pairs(
    decoder,
    prompt_ids,
    temperature: float,
    strategy: str,
    tree_nodes: int = 0,
    overlay_weight: float = 0.0,
    runs: int = RUNS,
    sampling=None,
    draft_size: str = "cost",
) -> Counter:
    """(first, second) generated token counts over RUNS seeds; tree_nodes > 0: the second
    token comes from verifying a draft tree (one level: up to 3 sibling drafts);
    overlay_weight > 0: drafts mix in the request's own context; draft_size "cost" (the
    default: the sizer decides what is verified) or "fixed" (every drafted token is)."""
    draft = DraftParams(
        k=4,
        strategy=strategy,
        tree_nodes=tree_nodes,
        overlay_weight=overlay_weight,
        draft_size=draft_size,
    )
    return sample_pairs_embedded(decoder, prompt_ids, temperature, draft, sampling, runs).counts


def chi_square_p_value(law: np.ndarray, counts: Counter, min_cells: int = 10) -> float:
    """Chi-square p-value of counts (keys: index tuples into law, e.g. (t1, t2) for a joint
    [V, V], (t1,) for a first-token law [V]) against law. Cells expected fewer than
    MIN_EXPECTED times are pooled into one; if that pool is expected fewer than MIN_EXPECTED
    times too, it joins the smallest cell."""
    runs = sum(counts.values())
    expected = law * runs
    cells = [tuple(int(i) for i in cell) for cell in np.argwhere(expected >= MIN_EXPECTED)]
    assert len(cells) >= min_cells, "the prompt should spread its mass over enough cells"
    cells.sort(key=lambda cell: -expected[cell])
    observed = [counts.get(cell, 0) for cell in cells]
    expected_cells = [float(expected[cell]) for cell in cells]
    rest_observed, rest_expected = runs - sum(observed), runs - sum(expected_cells)
    if rest_expected >= MIN_EXPECTED:
        observed.append(rest_observed)  # every other cell, pooled
        expected_cells.append(rest_expected)
    else:
        observed[-1] += rest_observed
        expected_cells[-1] += rest_expected
    return float(chisquare(observed, expected_cells).pvalue)


def outside_support(law: np.ndarray, counts: Counter) -> dict[tuple, int]:
    """The sampled cells that have probability 0 under law (e.g. a token top_k removed)."""
    return {cell: n for cell, n in counts.items() if law[cell] == 0}


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's presence/frequency penalties as a Hugging Face logits processor (generate runs
    a request's own processors after its repetition penalty, before the warpers)."""

    def __init__(self, presence: float, frequency: float) -> None:
        self.presence, self.frequency = presence, frequency

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        return openai_penalties(input_ids, scores, self.presence, self.frequency)


def hf_generate(
    model,
    prompt_ids: list[int],
    max_tokens: int,
    eos_token_ids: list[int],
    sampling=None,
    **kwargs: object,
) -> list[int]:
    """Hugging Face generate's continuation of prompt_ids (greedy unless kwargs say otherwise)
    with the controls' penalties (repetition_penalty, and OpenAI's as OpenAIPenalties), up to
    max_tokens tokens, cut before the first EOS. kwargs go to generate as they are."""
    presence = _control(sampling, "presence_penalty", 0.0)
    frequency = _control(sampling, "frequency_penalty", 0.0)
    processors = [OpenAIPenalties(presence, frequency)] if presence or frequency else []
    repetition = getattr(sampling, "repetition_penalty", None) if sampling is not None else None
    if repetition is not None:
        kwargs["repetition_penalty"] = repetition
    kwargs.setdefault("do_sample", False)
    input_ids = torch.tensor([prompt_ids])  # [1, len]
    with torch.inference_mode():
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_tokens,
            eos_token_id=eos_token_ids,
            pad_token_id=eos_token_ids[0],
            logits_processor=LogitsProcessorList(processors),
            **kwargs,
        )
    tokens = output[0, len(prompt_ids) :].tolist()  # [generated]
    return next((tokens[:i] for i, t in enumerate(tokens) if t in eos_token_ids), tokens)


def greedy_over_gateway(stub, prompts: list[str], max_tokens: int, draft, sampling) -> list:
    """The GenerateResponse of a greedy (temperature 0) request of each prompt through a
    gateway, with these DraftOptions and SamplingControls messages."""
    from speculant.v1 import gateway_pb2

    responses = []
    for prompt in prompts:
        request = gateway_pb2.GenerateRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            seed=0,
            draft=draft,
            sampling=sampling,
        )
        responses.append(stub.Generate(request, timeout=60))
    return responses
