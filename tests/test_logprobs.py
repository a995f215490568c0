"""Log-probabilities: the target's own log p of each emitted token, and its most likely
alternatives, under the processed distribution (tests/sampling_checks.py; temperature 0: the
log-softmax of the penalised logits), exactly as plain decoding reports them.

For a sampled and a greedy request with top_logprobs=5 and some controls on, every reported
logprob and alternative equals what ONE plain forward pass over prompt + output gives after the
same processing with Hugging Face's processors, at every position (drafts accepted within a
round included); embedded and over the services, streamed and not.

Equal within 1e-5, or within twice the float32 noise of the model itself where that is larger:
plain decoding as ``generate`` runs it (a cached forward per token) and one forward over the
whole sequence already differ by up to about 2e-5 in log p on these requests (the matrix
products of different shapes round differently), so no implementation could meet 1e-5 against
either of them. Each test measures that noise on its own tokens.
"""

from __future__ import annotations

import math
from dataclasses import replace

import grpc
import pytest
import torch
from transformers import DynamicCache

from gateway.generation import GenerationRequest, GenerationResult
from speculant.config import DraftParams, SamplingControls
from speculant.v1 import common_pb2, gateway_pb2
from tests.assets import load_dev_prompts
from tests.sampling_checks import processed_log_probs

TOLERANCE = 1e-5
MAX_NOISE = 1e-4  # the model's own float32 noise must stay far below any real error
TOP = 5
MAX_TOKENS = 48
# (temperature, controls, draft strategy, tree_nodes): a sampled and a greedy request. At
# temperature 0 the warpers (top_k here) do not apply: the logprobs are the penalised logits'.
REQUESTS = {
    "sampled": (
        0.8,
        {"top_k": 40, "repetition_penalty": 1.2, "presence_penalty": 0.5},
        "sampling",
        0,
    ),
    "greedy": (
        0.0,
        {"repetition_penalty": 1.3, "frequency_penalty": 0.5, "top_k": 5},
        "greedy",
        12,
    ),
}
STRATEGY_PB = {
    "greedy": common_pb2.DRAFT_STRATEGY_GREEDY,
    "sampling": common_pb2.DRAFT_STRATEGY_SAMPLING,
}


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    return tokenizer(load_dev_prompts(2)[1]).input_ids


def reference_log_probs(
    model,
    prompt_ids: list[int],
    output: list[int],
    temperature: float,
    controls: dict,
    stale: bool = False,
) -> torch.Tensor:
    """log p [n, V] at each of the n output positions: one forward pass over prompt + output,
    each row processed with its history (the prompt and the output before it; stale: the
    prompt only, the mistake of a negative control)."""
    ids = torch.tensor([prompt_ids + output])  # [1, len + n]
    with torch.inference_mode():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]  # [n, V]
    sampling = SamplingControls(**controls)
    rows = [
        processed_log_probs(
            logits[i : i + 1],
            ids[:, : len(prompt_ids) + (0 if stale else i)],
            temperature,
            sampling,
        )
        for i in range(len(output))
    ]
    return torch.cat(rows)  # [n, V]


def plain_decoding_log_probs(
    model, prompt_ids: list[int], output: list[int], temperature: float, controls: dict
) -> torch.Tensor:
    """log p [n, V] as plain decoding computes it: the prompt, then one cached forward per
    output token (as generate does), each row processed with its history."""
    ids = torch.tensor([prompt_ids + output])  # [1, len + n]
    cache = DynamicCache(config=model.config)
    start = len(prompt_ids)
    with torch.inference_mode():
        rows = [model(ids[:, :start], cache=cache, use_cache=True).logits[:, -1]]  # [1, V]
        for i in range(start, ids.shape[1] - 1):
            rows.append(model(ids[:, i : i + 1], cache=cache, use_cache=True).logits[:, -1])
    sampling = SamplingControls(**controls)
    return torch.cat(
        [
            processed_log_probs(row, ids[:, : start + i], temperature, sampling)
            for i, row in enumerate(rows)
        ]
    )  # [n, V]


RUN_TO_RUN = 4e-5  # twice the model's own float32 noise on these requests (~2e-5, see above)


def assert_same_logprobs(got, expected) -> None:
    """Two runs' logprobs of the same tokens: the same tokens and alternatives, values equal
    within RUN_TO_RUN. (Cost-aware draft sizes verify other draft shapes from run to run, and
    forwards of other shapes round differently; the tokens are the same.)"""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.token_id == b.token_id and tuple(a.top_token_ids) == tuple(b.top_token_ids)
        assert abs(a.logprob - b.logprob) <= RUN_TO_RUN
        for x, y in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert abs(x - y) <= RUN_TO_RUN


def tolerance_for(model, prompt_ids, output, temperature, controls, reference) -> float:
    """max(TOLERANCE, twice the largest difference between plain decoding's log p and the
    reference's (one forward), over every finite entry of every position)."""
    plain = plain_decoding_log_probs(model, prompt_ids, output, temperature, controls)
    finite = torch.isfinite(reference) & torch.isfinite(plain)
    assert torch.equal(torch.isfinite(reference), torch.isfinite(plain)), "supports differ"
    noise = float((plain - reference)[finite].abs().max())
    assert noise < MAX_NOISE, f"the model's own forwards differ by {noise:.1e}"
    return max(TOLERANCE, 2 * noise)


def check_logprobs(
    reference: torch.Tensor, output: list[int], logprobs: list, tolerance: float
) -> None:
    """logprobs (TokenLogprobs or TokenLogprob messages, one per output token) agree with the
    reference within tolerance: the token's log p, and TOP alternatives that are the most
    likely tokens (ties in any order), most likely first, each with its log p."""

    def _close(a: float, b: float) -> bool:
        return a == b or abs(a - b) <= tolerance  # a == b: both -inf

    assert len(logprobs) == len(output), f"{len(logprobs)} logprobs for {len(output)} tokens"
    for i, (token, entry) in enumerate(zip(output, logprobs, strict=True)):
        row = reference[i]  # [V]
        assert entry.token_id == token, f"position {i}: logprob of {entry.token_id}, not {token}"
        expected = float(row[token])
        assert _close(entry.logprob, expected), f"position {i}: {entry.logprob} != {expected}"
        ids, values = list(entry.top_token_ids), list(entry.top_logprobs)
        assert len(ids) == len(values) == TOP, f"position {i}: {len(ids)} alternatives"
        assert len(set(ids)) == TOP, f"position {i}: repeated alternatives {ids}"
        for rank, (alternative, value) in enumerate(zip(ids, values, strict=True)):
            assert _close(value, float(row[alternative])), (
                f"position {i}, alternative {rank} (token {alternative}): {value} != "
                f"{float(row[alternative])}"
            )
        assert values == sorted(values, reverse=True), f"position {i}: not most likely first"
        best_left_out = max(float(v) for t, v in enumerate(row.tolist()) if t not in ids)
        assert best_left_out <= values[-1] + tolerance, (
            f"position {i}: a token of log p {best_left_out} is likelier than the alternatives"
        )
        if token in ids:  # the chosen token's own entry
            assert _close(values[ids.index(token)], entry.logprob)


def _request(prompt_ids, name: str, top_logprobs: int | None = TOP) -> GenerationRequest:
    temperature, controls, strategy, tree_nodes = REQUESTS[name]
    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=MAX_TOKENS,
        temperature=temperature,
        seed=7,
        draft=DraftParams(k=4, strategy=strategy, tree_nodes=tree_nodes, draft_size="fixed"),
        sampling=SamplingControls(**controls),
        top_logprobs=top_logprobs,
    )


@pytest.mark.parametrize("name", REQUESTS)
def test_logprobs_equal_a_plain_forward_embedded(embedded_decoder, prompt_ids, name):
    temperature, controls, _, _ = REQUESTS[name]
    result = embedded_decoder.coordinator.generate(_request(prompt_ids, name))
    assert len(result.token_ids) > MAX_TOKENS // 2
    assert result.stats.accepted_tokens > 0, "some positions should be accepted drafts"
    model = embedded_decoder.verifier.model.model
    reference = reference_log_probs(model, prompt_ids, result.token_ids, temperature, controls)
    tolerance = tolerance_for(model, prompt_ids, result.token_ids, temperature, controls, reference)
    check_logprobs(reference, result.token_ids, result.logprobs, tolerance)
    stale = reference_log_probs(model, prompt_ids, result.token_ids, temperature, controls, True)
    with pytest.raises(AssertionError):  # negative control: penalties over the prompt only
        check_logprobs(stale, result.token_ids, result.logprobs, tolerance)

    chunks = list(embedded_decoder.coordinator.stream(_request(prompt_ids, name)))
    final = chunks[-1]
    assert isinstance(final, GenerationResult) and final.token_ids == result.token_ids
    streamed = [lp for chunk in chunks[:-1] for lp in chunk.logprobs]
    assert_same_logprobs(streamed, result.logprobs)
    for chunk in chunks[:-1]:
        assert len(chunk.logprobs) == len(chunk.token_ids)


def test_no_logprobs_unless_asked_embedded(embedded_decoder, prompt_ids):
    result = embedded_decoder.coordinator.generate(_request(prompt_ids, "sampled", None))
    assert result.token_ids and result.logprobs == []
    bare = embedded_decoder.coordinator.generate(_request(prompt_ids, "sampled", 0))
    assert bare.token_ids == result.token_ids  # asking for logprobs changes no token
    assert len(bare.logprobs) == len(bare.token_ids)
    assert all(lp.top_token_ids == () and lp.top_logprobs == () for lp in bare.logprobs)
    assert [lp.token_id for lp in bare.logprobs] == bare.token_ids


def _pb_request(prompt_ids, name: str, top_logprobs: int | None = TOP):
    temperature, controls, strategy, tree_nodes = REQUESTS[name]
    return gateway_pb2.GenerateRequest(
        prompt_token_ids=prompt_ids,
        max_tokens=MAX_TOKENS,
        temperature=temperature,
        seed=7,
        draft=common_pb2.DraftOptions(
            k=4, strategy=STRATEGY_PB[strategy], tree_nodes=tree_nodes, draft_size="fixed"
        ),
        sampling=common_pb2.SamplingControls(**controls),
        top_logprobs=top_logprobs,
    )


@pytest.mark.parametrize("name", REQUESTS)
def test_logprobs_equal_a_plain_forward_over_services(services, embedded_decoder, prompt_ids, name):
    temperature, controls, _, _ = REQUESTS[name]
    response = services.gateway.Generate(_pb_request(prompt_ids, name), timeout=60)
    output = list(response.token_ids)
    assert len(output) > MAX_TOKENS // 2
    assert response.stats.accepted_tokens > 0, "some positions should be accepted drafts"
    model = embedded_decoder.verifier.model.model
    reference = reference_log_probs(model, prompt_ids, output, temperature, controls)
    tolerance = tolerance_for(model, prompt_ids, output, temperature, controls, reference)
    check_logprobs(reference, output, response.logprobs, tolerance)
    stale = reference_log_probs(model, prompt_ids, output, temperature, controls, stale=True)
    with pytest.raises(AssertionError):  # negative control: penalties over the prompt only
        check_logprobs(stale, output, response.logprobs, tolerance)

    messages = list(services.gateway.GenerateStream(_pb_request(prompt_ids, name), timeout=60))
    assert [t for m in messages for t in m.token_ids] == output
    for message in messages:
        assert len(message.logprobs) == len(message.token_ids)
    assert_same_logprobs([lp for m in messages for lp in m.logprobs], list(response.logprobs))


def test_no_logprobs_unless_asked_over_services(services, prompt_ids):
    response = services.gateway.Generate(_pb_request(prompt_ids, "sampled", None), timeout=60)
    assert response.token_ids and not response.logprobs
    bare = services.gateway.Generate(_pb_request(prompt_ids, "sampled", 0), timeout=60)
    assert list(bare.token_ids) == list(response.token_ids)
    assert [lp.token_id for lp in bare.logprobs] == list(bare.token_ids)
    assert all(not lp.top_token_ids and not lp.top_logprobs for lp in bare.logprobs)
    assert all(math.isfinite(lp.logprob) and lp.logprob <= 0 for lp in bare.logprobs)


def test_too_many_alternatives_are_refused_over_services(services, prompt_ids):
    with pytest.raises(grpc.RpcError) as caught:
        services.gateway.Generate(_pb_request(prompt_ids, "sampled", 21), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "top_logprobs" in caught.value.details()


def test_a_stop_string_cuts_the_logprobs_with_the_tokens(embedded_decoder, prompt_ids):
    full = embedded_decoder.coordinator.generate(_request(prompt_ids, "greedy"))
    stop = embedded_decoder.tokenizer.decode(full.token_ids[10:12])  # text the output reaches
    assert stop.strip(), "the stop string should be visible text"
    cut = embedded_decoder.coordinator.generate(
        replace(_request(prompt_ids, "greedy"), stop=(stop,))
    )
    assert len(cut.token_ids) < len(full.token_ids)
    assert len(cut.logprobs) == len(cut.token_ids)
    assert_same_logprobs(cut.logprobs, full.logprobs[: len(cut.token_ids)])
