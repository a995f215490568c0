"""Errors of the gateway's HTTP API: OpenAI-style JSON naming the field, for bad parameters and
for each row of docs/http-api.md's error table; a stopping gateway's 503s; the HTTP status of
each error class.

Real draft, verifier and gateway servers on localhost ports (the ``http`` fixture,
tests/fixtures/http_api.py).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import openai
import pytest

from gateway.api.answers import http_error
from gateway.api.app import MAX_BODY_BYTES, HttpApiServer
from speculant.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    RemoteError,
    ResourceExhaustedError,
    UnavailableError,
)
from tests.http_calls import (
    MODEL,
    PROMPT,
    Http,
    backendless_engine,
    fetch_json,
    live_sessions,
    post_json,
    raw_request,
    stopping_api,
)

# One row of the error table, checked: (status, JSON body).
Check = Callable[[], tuple[int, dict | None]]


@pytest.mark.parametrize(
    "endpoint, body, param",
    [
        ("completions", {"prompt": PROMPT, "n": 0}, "n"),
        ("completions", {"prompt": PROMPT, "max_tokens": -1}, "max_tokens"),
        ("completions", {"prompt": PROMPT, "temperature": -1}, "temperature"),
        ("completions", {"prompt": PROMPT, "seed": -3}, "seed"),
        ("completions", {"prompt": PROMPT, "stop": [1]}, "stop"),
        ("completions", {"prompt": PROMPT, "top_k": -2}, "top_k"),
        ("completions", {"prompt": PROMPT, "min_p": 2}, "min_p"),
        ("completions", {"prompt": PROMPT, "repetition_penalty": 0}, "repetition_penalty"),
        ("completions", {"prompt": PROMPT, "frequency_penalty": "x"}, "frequency_penalty"),
        ("completions", {"prompt": PROMPT, "logit_bias": {"5": 1}}, "logit_bias"),
        ("completions", {"prompt": PROMPT, "best_of": 3}, "best_of"),
        ("completions", {"prompt": PROMPT, "speculant": {"k": 0}}, "speculant.k"),
        ("completions", {"prompt": PROMPT, "speculant": {"kk": 2}}, "speculant.kk"),
        (  # a retired drafting option is an unknown field (docs/benchmarks.md, Retired options)
            "completions",
            {"prompt": PROMPT, "speculant": {"min_draft_prob": 0.1}},
            "speculant.min_draft_prob",
        ),
        (
            "completions",
            {"prompt": PROMPT, "speculant": {"adaptive_k": True}},
            "speculant.adaptive_k",
        ),
        ("completions", {"prompt": ["a", 5]}, "prompt[1]"),
        ("completions", {"prompt": []}, "prompt"),
        ("completions", {"prompt": [1, -4]}, "prompt[1]"),
        ("completions", {"prompt": [[1, 2], [10**9]]}, "prompt"),  # not in the vocabulary
        ("completions", {"prompt": ["a"] * 9, "n": 8}, "n"),  # 72 choices
        ("completions", {"prompt": ""}, "prompt"),
        ("completions", {"prompt": PROMPT, "stream": True, "max_tokens": -1}, "max_tokens"),
        ("chat/completions", {"messages": []}, "messages"),
        (
            "chat/completions",
            {"messages": [{"role": "robot", "content": "hi"}]},
            "messages[0].role",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -5},
            "max_completion_tokens",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
            "top_logprobs",  # without logprobs: true
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logprobs": 1},
            "logprobs",
        ),
    ],
)
def test_bad_parameters_are_400_naming_the_field(http, endpoint, body, param):
    status, answer = post_json(f"{http.url}/v1/{endpoint}", {"model": MODEL, **body})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param
    assert "Traceback" not in answer["error"]["message"]


def test_a_stopping_gateway_answers_503_to_health_and_requests_but_serves_metrics():
    with stopping_api() as url:
        status, answer = fetch_json(f"{url}/health")
        assert status == 503 and "shutting down" in answer["error"], answer
        status, answer = post_json(f"{url}/v1/chat/completions", {"messages": []})
        assert status == 503 and answer["error"]["type"] == "service_unavailable", answer
        assert "shutting down" in answer["error"]["message"]
        with urllib.request.urlopen(f"{url}/metrics", timeout=60) as metrics:
            assert metrics.status == 200


def _too_large(http: Http) -> tuple[int, dict | None]:
    return raw_request(
        http.url,
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n{" % (MAX_BODY_BYTES + 1),
    )


def _over_capacity(http: Http) -> tuple[int, dict | None]:
    # two choices on a gateway with one slot: the second is refused, the first cancelled
    return post_json(
        f"{http.busy_url}/v1/completions", {"prompt": PROMPT, "n": 2, "max_tokens": 300}
    )


def _backend_down() -> tuple[int, dict | None]:
    api = HttpApiServer(backendless_engine(), model_name=MODEL).start()
    try:
        return post_json(f"{api.url}/v1/completions", {"prompt": PROMPT})
    finally:
        api.stop()


def _shutting_down() -> tuple[int, dict | None]:
    with stopping_api() as url:
        return post_json(f"{url}/v1/completions", {"prompt": PROMPT})


def _internal() -> tuple[int, dict | None]:
    error = http_error(KeyError("a bug"))
    return error.status, error.body()


def _request_body_checks(completions: str) -> dict[str, Check]:
    """The error table's rows about a request's body (its JSON, fields and values), sent to
    the completions URL."""
    json_headers = {"Content-Type": "application/json"}
    long_prompt = "Once upon a time there was a cat. " * 200
    return {
        "bad-json": lambda: fetch_json(completions, b'{"prompt": "Once', json_headers),
        "not-a-number": lambda: fetch_json(
            completions, b'{"prompt": "Once", "temperature": NaN}', json_headers
        ),
        "too-deep": lambda: fetch_json(
            completions, b'{"prompt": ' + b"[" * 2000 + b"1" + b"]" * 2000 + b"}", json_headers
        ),
        "not-an-object": lambda: post_json(completions, ["not", "an", "object"]),
        "unknown-field": lambda: post_json(completions, {"prompt": PROMPT, "frobnicate": 1}),
        "wrong-type": lambda: post_json(completions, {"prompt": PROMPT, "max_tokens": "ten"}),
        "out-of-range": lambda: post_json(completions, {"prompt": PROMPT, "top_p": 1.5}),
        "penalty-out-of-range": lambda: post_json(
            completions, {"prompt": PROMPT, "presence_penalty": 2.5}
        ),
        "too-many-choices": lambda: post_json(completions, {"prompt": PROMPT, "n": 17}),
        "logprobs-out-of-range": lambda: post_json(completions, {"prompt": PROMPT, "logprobs": 6}),
        "unsupported": lambda: post_json(completions, {"prompt": PROMPT, "echo": True}),
        "context-length": lambda: post_json(completions, {"prompt": long_prompt}),
    }


def _error_table_checks(http: Http) -> dict[str, Check]:
    """Each row of docs/http-api.md's error table, by its case name: (status, body)."""
    completions = f"{http.url}/v1/completions"
    return {
        **_request_body_checks(completions),
        "bad-graph-name": lambda: post_json(
            completions, {"model": f"{MODEL}:no.dots", "prompt": PROMPT}
        ),
        "unknown-graph": lambda: post_json(
            completions, {"model": f"{MODEL}:nope", "prompt": PROMPT}
        ),
        "admin-off": lambda: fetch_json(f"{http.url}/admin/graphs"),
        "no-token": lambda: post_json(f"{http.auth_url}/v1/completions", {"prompt": PROMPT}),
        "wrong-token": lambda: post_json(
            f"{http.auth_url}/v1/completions", {"prompt": PROMPT}, {"Authorization": "Bearer x"}
        ),
        "unknown-route": lambda: fetch_json(f"{http.url}/v2/nothing"),
        "wrong-method": lambda: fetch_json(completions),  # a GET
        "too-large": lambda: _too_large(http),
        "over-capacity": lambda: _over_capacity(http),
        "backend-down": _backend_down,
        "shutting-down": _shutting_down,
        "internal": _internal,
    }


def _documented_error_table() -> dict[str, tuple[int, str | None]]:
    """docs/http-api.md's error table: case -> (status, param or None)."""
    docs = (Path(__file__).parents[1] / "docs" / "http-api.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \|[^|]*\| (\d{3}) \| ([^|]*) \|", docs, re.MULTILINE)
    assert rows, "no error table in docs/http-api.md"
    table = {}
    for case, status, param in rows:
        param = param.strip()
        table[case] = (int(status), None if param in ("", "–") else param.strip("`"))
    return table


def test_every_row_of_the_documented_error_table(http):
    """docs/http-api.md's error table, row by row: the status, the OpenAI error body and the
    field it names; the table and these checks list the same cases."""
    table = _documented_error_table()
    checks = _error_table_checks(http)
    assert set(table) == set(checks)
    for case, (status, param) in table.items():
        got, body = checks[case]()
        assert got == status, (case, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}, case
        assert body["error"]["param"] == param, (case, body)
        assert "Traceback" not in body["error"]["message"]
    assert live_sessions(http) == 0
    with pytest.raises(openai.BadRequestError) as excinfo:
        http.client.completions.create(model=MODEL, prompt=PROMPT, top_p=1.5)
    assert excinfo.value.status_code == 400 and excinfo.value.param == "top_p"
    assert post_json(f"{http.url}/v1/completions", {"prompt": "x" * 7000})[1]["error"]["code"] == (
        "context_length_exceeded"
    )


@pytest.mark.parametrize(
    "error, status",
    [
        (InvalidArgumentError("k", "bad"), 400),
        (OutOfRangeError("prompt: too long"), 400),
        (RemoteError(grpc.StatusCode.UNAUTHENTICATED, "no"), 401),
        (RemoteError(grpc.StatusCode.PERMISSION_DENIED, "admin calls are off"), 403),
        (NotFoundError("session"), 404),
        (FailedPreconditionError("tokenizer mismatch"), 412),
        (ResourceExhaustedError("busy"), 429),
        (UnavailableError("down"), 503),
        (RemoteError(grpc.StatusCode.INTERNAL, "verifier: internal error"), 500),
        (KeyError("a bug"), 500),
    ],
)
def test_error_classes_map_to_http_statuses(error, status):
    answer = http_error(error)
    assert answer.status == status
    assert set(answer.body()["error"]) == {"message", "type", "param", "code"}
    if status == 500 and not isinstance(error, RemoteError):
        assert answer.body()["error"]["message"] == "internal error"  # nothing of the bug
