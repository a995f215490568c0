"""Sampling controls and top_logprobs are validated by name: an out-of-range value (or NaN) is
an InvalidArgumentError naming the field embedded, and INVALID_ARGUMENT naming it over gRPC,
before any work; the edges of each range are accepted."""

from __future__ import annotations

import math

import grpc
import pytest

from gateway.generation import GenerationRequest
from speculant.config import DraftParams, GenerationConfig, SamplingControls
from speculant.errors import InvalidArgumentError
from speculant.v1 import common_pb2, gateway_pb2

NAN = math.nan
BAD = [
    ("top_k", -1),
    ("top_p", 0.0),
    ("top_p", -0.1),
    ("top_p", 1.5),
    ("top_p", NAN),
    ("min_p", -0.1),
    ("min_p", 1.5),
    ("min_p", NAN),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", NAN),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", 0.009),  # the range is [0.01, 100]
    ("repetition_penalty", 101.0),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.5),
    ("presence_penalty", NAN),
    ("frequency_penalty", 2.01),
    ("frequency_penalty", -3.0),
    ("frequency_penalty", NAN),
    ("top_logprobs", -1),
    ("top_logprobs", 21),
]
GOOD = [
    ("top_k", 0),
    ("top_k", 1),
    ("top_k", 100_000),  # more than the vocabulary: every token kept, as in Hugging Face
    ("top_p", 1.0),
    ("top_p", 1e-9),
    ("min_p", 0.0),
    ("min_p", 1.0),
    ("repetition_penalty", 0.01),
    ("repetition_penalty", 100.0),
    ("presence_penalty", 2.0),
    ("presence_penalty", -2.0),
    ("frequency_penalty", 2.0),
    ("frequency_penalty", -2.0),
    ("top_logprobs", 0),
    ("top_logprobs", 20),
]


def _ids(cases) -> list[str]:
    return [f"{name}={value}" for name, value in cases]


def _request(prompt_ids: list[int], name: str, value) -> GenerationRequest:
    fields = {"top_logprobs": value} if name == "top_logprobs" else {}
    sampling = SamplingControls() if fields else SamplingControls(**{name: value})
    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=2,
        temperature=1.0,
        seed=0,
        draft=DraftParams(k=2),
        sampling=sampling,
        **fields,
    )


@pytest.mark.parametrize(("name", "value"), BAD, ids=_ids(BAD))
def test_bad_values_are_refused_embedded(embedded_decoder, name, value):
    prompt_ids = embedded_decoder.tokenizer("Once").input_ids
    with pytest.raises(InvalidArgumentError) as caught:
        embedded_decoder.coordinator.generate(_request(prompt_ids, name, value))
    assert caught.value.field.split(".")[-1] == name, str(caught.value)
    with pytest.raises(InvalidArgumentError) as caught:  # the same through GenerationConfig
        embedded_decoder.generate("Once", generation_config=GenerationConfig(**{name: value}))
    assert caught.value.field.split(".")[-1] == name, str(caught.value)


@pytest.mark.parametrize(("name", "value"), GOOD, ids=_ids(GOOD))
def test_range_edges_are_accepted_embedded(embedded_decoder, name, value):
    prompt_ids = embedded_decoder.tokenizer("Once").input_ids
    result = embedded_decoder.coordinator.generate(_request(prompt_ids, name, value))
    assert len(result.token_ids) == 2


def _pb_request(name: str, value) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest(
        prompt="Once", max_tokens=2, seed=0, draft=common_pb2.DraftOptions(k=2)
    )
    if name == "top_logprobs":
        request.top_logprobs = value
    else:
        setattr(request.sampling, name, value)
    return request


@pytest.mark.parametrize(("name", "value"), BAD, ids=_ids(BAD))
def test_bad_values_are_refused_over_grpc(services, name, value):
    for call in (
        services.gateway.Generate,
        lambda r, timeout: list(services.gateway.GenerateStream(r, timeout=timeout)),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call(_pb_request(name, value), timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert name in caught.value.details(), caught.value.details()


@pytest.mark.parametrize(("name", "value"), GOOD, ids=_ids(GOOD))
def test_range_edges_are_accepted_over_grpc(services, name, value):
    response = services.gateway.Generate(_pb_request(name, value), timeout=30)
    assert len(response.token_ids) == 2
