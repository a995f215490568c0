"""The Python clients (speculant.client) against a real gateway: the same answers as the raw
stubs, streaming that adds up to the unary text, errors with the gateway's status code."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from speculant.client import AsyncSpeculantClient, SpeculantClient
from speculant.errors import RemoteError
from speculant.v1 import common_pb2, gateway_pb2

PARAMS = {"max_tokens": 24, "temperature": 0.0, "k": 8, "strategy": "greedy"}


def test_sync_client_generates_streams_and_reports_health(services):
    raw = services.gateway.Generate(
        gateway_pb2.GenerateRequest(
            prompt="Once upon a time",
            max_tokens=24,
            temperature=0,
            draft=common_pb2.DraftOptions(k=8, strategy=common_pb2.DRAFT_STRATEGY_GREEDY),
        ),
        timeout=30,
    )
    with SpeculantClient(services.gateway_address) as client:
        assert client.health() == "SERVING"
        result = client.generate("Once upon a time", **PARAMS)
        assert list(result.token_ids) == list(raw.token_ids) and result.text == raw.text
        chunks = list(client.stream("Once upon a time", **PARAMS))
        assert "".join(c.text_delta for c in chunks) == result.text
        assert chunks[-1].finish_reason == gateway_pb2.FINISH_REASON_MAX_TOKENS
        with pytest.raises(RemoteError) as caught:
            client.generate("Once", max_tokens=-1)
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert SpeculantClient("127.0.0.1:1").health() == "UNREACHABLE"


def test_async_client_gives_the_same_answers(services):
    async def run() -> tuple[str, str, str, list[int]]:
        async with AsyncSpeculantClient(services.gateway_address) as client:
            health = await client.health()
            result = await client.generate("Once upon a time", **PARAMS)
            chunks = [c async for c in client.stream("Once upon a time", **PARAMS)]
            text = "".join(c.text_delta for c in chunks)
            return health, result.text, text, list(result.token_ids)

    health, unary_text, streamed_text, tokens = asyncio.run(run())
    with SpeculantClient(services.gateway_address) as client:
        expected = client.generate("Once upon a time", **PARAMS)
    assert health == "SERVING"
    assert tokens == list(expected.token_ids) and unary_text == streamed_text == expected.text
