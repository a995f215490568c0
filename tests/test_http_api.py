"""The gateway's HTTP API (gateway.http_api) with the official `openai` client and urllib.

Real draft, verifier and gateway servers on localhost ports, and the HTTP API on the same
GatewayServicer as the gRPC gateway: completions (unary and streamed) must give exactly the
text of gRPC Generate for the same request, chat completions render messages with the
tokenizer's chat template (stories260K has none, so the gateway here loads a copy of its
tokenizer with a small template: same vocabulary, same fingerprint), and errors are
OpenAI-style JSON naming the field.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest

from gateway.http_io import MAX_BODY_BYTES, http_error
from gateway.http_server import HttpApiServer
from gateway.openai_format import choice_seed
from gateway.server import GatewayServicer
from speculant.client import generate_request
from speculant.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    RemoteError,
    ResourceExhaustedError,
    UnavailableError,
)
from speculant.metrics import Metrics
from speculant.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.assets import STORIES_MODEL
from tests.fixtures.e2e import verifier_config
from tests.fixtures.tls import server_tls

TOKEN = "s3cret-token"
MODEL = "stories260K"
PROMPT = "Once upon a time, there was a little girl named Lily."
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass
class Http:
    url: str  # the open HTTP API
    auth_url: str  # the same gateway, requiring TOKEN
    busy_url: str  # another gateway on the same backends, with --max-concurrent 1
    gateway: gateway_pb2_grpc.GatewayServiceStub
    verifier: verifier_pb2_grpc.VerifierServiceStub
    client: openai.OpenAI


def _templated_tokenizer(folder: Path) -> Path:
    """stories260K's tokenizer files with a chat template added."""
    for name in ("tokenizer.json", "tokenizer.model", "special_tokens_map.json"):
        shutil.copy(STORIES_MODEL / name, folder / name)
    config = json.loads((STORIES_MODEL / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def http(tinystories_graph, tmp_path_factory) -> Iterator[Http]:
    from draft_service.server import start_server as start_draft
    from gateway.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    tokenizer = _templated_tokenizer(tmp_path_factory.mktemp("chat-tokenizer"))
    draft = start_draft(tinystories_graph, port=0)
    verifier_server, local_verifier = start_verifier(verifier_config(), port=0)
    metrics = Metrics()
    gateway_server, servicer = start_gateway(
        [draft.address],
        verifier_server.address,
        port=0,
        tokenizer_name=str(tokenizer),
        metrics=metrics,
    )
    busy_server, busy_servicer = start_gateway(
        [draft.address], verifier_server.address, port=0, max_concurrent=1
    )
    api = HttpApiServer(servicer, model_name=MODEL, registry=metrics.registry).start()
    auth_api = HttpApiServer(servicer, auth_token=TOKEN, model_name=MODEL).start()
    busy_api = HttpApiServer(busy_servicer, model_name=MODEL).start()
    channels = [grpc.insecure_channel(a) for a in (gateway_server.address, verifier_server.address)]
    client = openai.OpenAI(base_url=f"{api.url}/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        yield Http(
            api.url,
            auth_api.url,
            busy_api.url,
            gateway_pb2_grpc.GatewayServiceStub(channels[0]),
            verifier_pb2_grpc.VerifierServiceStub(channels[1]),
            client,
        )
    finally:
        client.close()
        for channel in channels:
            channel.close()
        busy_api.stop()
        auth_api.stop()
        api.stop()
        busy_server.stop(0)
        gateway_server.stop(0)
        verifier_server.stop(0)
        local_verifier.close()
        draft.stop(0)


def _request(
    url: str, body: bytes | None = None, headers: dict[str, str] | None = None, **kw
) -> tuple[int, dict]:
    """(status, JSON body) of a GET (no body) or POST."""
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60, **kw) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(url: str, body: dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    return _request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )


def _live_sessions(http: Http) -> int:
    """The verifier's live sessions once released ones are gone: a session's stream ends
    asynchronously after the answer, so wait a little for the count to settle."""
    for _ in range(100):
        live = http.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10).live_sessions
        if live == 0:
            break
        time.sleep(0.05)
    return live


@pytest.mark.parametrize("temperature, seed", [(0.0, None), (0.8, 11)])
def test_completions_unary_stream_and_grpc_agree(http, temperature, seed):
    options = {"max_tokens": 48, "temperature": temperature, "seed": seed, "stop": ["\n\n"]}
    draft = {"k": 6, "strategy": "greedy"}  # a seeded draw depends on the drafts too
    unary = http.client.completions.create(
        model=MODEL, prompt=PROMPT, extra_body={"speculant": draft}, **options
    )
    chunks = list(
        http.client.completions.create(
            model="any-name",
            prompt=[PROMPT],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"speculant": draft},
            **options,
        )
    )
    grpc_result = http.gateway.Generate(
        generate_request(PROMPT, **{k: v for k, v in options.items() if v is not None}, **draft),
        timeout=60,
    )
    assert grpc_result.text and unary.choices[0].text == grpc_result.text
    assert "".join(c.choices[0].text for c in chunks if c.choices) == grpc_result.text
    expected_finish = {
        gateway_pb2.FINISH_REASON_MAX_TOKENS: "length",
        gateway_pb2.FINISH_REASON_EOS: "stop",
        gateway_pb2.FINISH_REASON_STOP: "stop",
    }[grpc_result.finish_reason]
    assert unary.choices[0].finish_reason == expected_finish
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected_finish
    assert unary.object == "text_completion" and unary.model == MODEL
    assert unary.usage.completion_tokens == len(grpc_result.token_ids)
    assert unary.usage.prompt_tokens == grpc_result.stats.prompt_tokens > 0
    assert unary.usage.total_tokens == unary.usage.prompt_tokens + unary.usage.completion_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage == unary.usage
    stats = unary.model_extra["speculant_stats"]
    assert stats["generated_tokens"] == len(grpc_result.token_ids) and stats["rounds"] >= 1
    assert len({c.id for c in chunks}) == 1


def test_chat_completions_use_the_chat_template(http):
    messages = [
        {"role": "system", "content": "You tell short stories."},
        {"role": "user", "content": [{"type": "text", "text": "Tell me about a cat."}]},
    ]
    unary = http.client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=40, temperature=0
    )
    chunks = list(
        http.client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=40, temperature=0, stream=True
        )
    )
    flat = [{"role": "system", "content": messages[0]["content"]}]
    flat.append({"role": "user", "content": "Tell me about a cat."})
    grpc_result = http.gateway.Generate(
        generate_request(messages=flat, max_tokens=40, temperature=0), timeout=60
    )
    message = unary.choices[0].message
    assert message.role == "assistant" and message.content == grpc_result.text != ""
    assert unary.object == "chat.completion"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == grpc_result.text
    assert chunks[-1].choices[0].finish_reason == unary.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    # the template's tokens count as prompt tokens: more than the two contents alone
    assert unary.usage.prompt_tokens == grpc_result.stats.prompt_tokens


def test_n_choices_and_lists_of_prompts_are_indexed_seeded_and_counted(http):
    """prompt = [text, token ids] x n=2: four choices indexed prompt * n + j; choice j of a
    prompt is the single request seeded with choice_seed(seed, j); usage counts each prompt
    once and every choice's tokens."""
    other_ids = [403, 407, 261, 378, 432]  # " Once upon a time,"
    sampling = {"temperature": 0.9, "top_p": 0.9, "max_tokens": 12, "speculant": {"k": 4}}
    answer = _post(
        f"{http.url}/v1/completions",
        {"prompt": [PROMPT, other_ids], "n": 2, "seed": 7, **sampling},
    )[1]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]

    def single(prompt, seed):
        return _post(f"{http.url}/v1/completions", {"prompt": prompt, "seed": seed, **sampling})[1]

    singles = [
        single(prompt, choice_seed(7, j)) for prompt in (PROMPT, other_ids) for j in range(2)
    ]
    assert [c["text"] for c in answer["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert choice_seed(7, 0) == 7 and choice_seed(7, 1) != choice_seed(7, 2)
    prompt_tokens = singles[0]["usage"]["prompt_tokens"] + singles[2]["usage"]["prompt_tokens"]
    assert answer["usage"]["prompt_tokens"] == prompt_tokens
    assert answer["usage"]["completion_tokens"] == sum(
        s["usage"]["completion_tokens"] for s in singles
    )
    chunks = list(
        http.client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            n=2,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
            temperature=0.9,
            top_p=0.9,
            max_tokens=12,
            extra_body={"speculant": {"k": 4}},
        )
    )
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c["text"] for c in answer["choices"][:2]]
    assert chunks[-1].usage.completion_tokens == answer["usage"]["completion_tokens"] - sum(
        c["usage"]["completion_tokens"] for c in singles[2:]
    )
    assert _live_sessions(http) == 0


def test_logprobs_in_openai_shapes_match_the_tokens(http):
    """Greedy: each token is the most likely, its logprob the top alternative's, all <= 0; the
    token texts spell the text; the stream reports the same as the unary answer."""
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 3}
    unary = _post(f"{http.url}/v1/completions", body)[1]
    logprobs = unary["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == unary["usage"]["completion_tokens"] == 10
    assert "".join(logprobs["tokens"]) == unary["choices"][0]["text"]
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    for token, logprob, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert logprob <= 0 and 1 <= len(top) <= 3 and all(v <= 0 for v in top.values())
        assert top[token] == pytest.approx(logprob) == max(top.values())
    generated = _post(
        f"{http.url}/generate",
        {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "top_logprobs": 3},
    )[1]
    assert [e["logprob"] for e in generated["logprobs"]] == pytest.approx(
        logprobs["token_logprobs"], abs=1e-6
    )
    assert [e["token_id"] for e in generated["logprobs"]] == generated["token_ids"]
    streamed = list(
        http.client.completions.create(model=MODEL, stream=True, **{**body, "logprobs": 3})
    )
    tokens = [
        t
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert tokens == logprobs["tokens"]
    chat = http.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about a cat."}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens == 8
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
    without = http.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
    )
    assert without.choices[0].logprobs is None


def test_metrics_are_served_on_the_http_port(http):
    _post(f"{http.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    with urllib.request.urlopen(f"{http.url}/metrics", timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    finished = re.search(
        r'^speculant_gateway_generations_total\{finish_reason="max_tokens"\} (\S+)',
        text,
        re.MULTILINE,
    )
    assert finished and float(finished.group(1)) >= 1
    assert _request(f"{http.auth_url}/metrics")[0] == 404  # that server was given no registry


def test_generate_and_health_and_models(http):
    status, body = _post(
        f"{http.url}/generate",
        {
            "prompt": PROMPT,
            "max_tokens": 24,
            "temperature": 0,
            "draft": {"k": 4, "strategy": "greedy"},
        },
    )
    grpc_result = http.gateway.Generate(
        generate_request(PROMPT, max_tokens=24, temperature=0), timeout=60
    )
    assert status == 200 and body["text"] == grpc_result.text
    assert body["token_ids"] == list(grpc_result.token_ids)
    assert body["finish_reason"] == "max_tokens" and body["stats"]["rounds"] >= 1
    assert _request(f"{http.url}/health") == (200, {"status": "ok", "model": MODEL})
    assert [m.id for m in http.client.models.list()] == [MODEL]
    assert _live_sessions(http) == 0


def _answer_headers(url: str, body: bytes | None = None, headers: dict[str, str] | None = None):
    """The answer's headers (an error answer's too)."""
    request = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.headers
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.headers


def test_every_answer_carries_its_request_id_and_the_logs_name_it(http, caplog):
    from speculant.request_context import RequestIdFilter

    caplog.set_level(logging.INFO, logger="gateway.http_api")
    caplog.handler.addFilter(RequestIdFilter())  # as the service's log handler has it
    body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "temperature": 0}).encode()
    json_headers = {"Content-Type": "application/json"}
    given = _answer_headers(
        f"{http.url}/generate", body, {**json_headers, "X-Request-Id": "req-42"}
    )
    assert given["X-Request-Id"] == "req-42"
    made = _answer_headers(f"{http.url}/generate", body, json_headers)["X-Request-Id"]
    assert len(made) == 32 and int(made, 16) >= 0  # a new id: uuid4 hex
    bad = _answer_headers(f"{http.url}/nope", None, {"X-Request-Id": "bad id with spaces"})
    assert bad["X-Request-Id"] not in (None, "bad id with spaces")  # replaced, on a 404 too
    ids = {"req-42", made, bad["X-Request-Id"]}
    for _ in range(100):  # the access line is written just after the answer is sent
        access = [r for r in caplog.records if r.getMessage().startswith("HTTP ")]
        by_id = {r.request_id: r.getMessage() for r in access}
        if ids <= set(by_id):
            break
        time.sleep(0.05)
    assert by_id["req-42"].startswith("HTTP POST /generate -> 200 in ")
    assert by_id[made].startswith("HTTP POST /generate -> 200")
    assert by_id[bad["X-Request-Id"]].startswith("HTTP GET /nope -> 404")


def test_a_client_that_disconnects_ends_its_generation(http):
    """Closing the connection mid-stream stops the rounds and frees the verifier session."""
    body = {"prompt": PROMPT, "max_tokens": 400, "temperature": 0, "speculant": {"k": 1}}
    full = _post(f"{http.url}/v1/completions", body)[1]["speculant_stats"]["rounds"]
    assert full >= 60  # enough rounds that stopping early shows
    passes = http.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10).forward_passes
    data = json.dumps({**body, "stream": True}).encode()
    host, port = http.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        assert connection.recv(15) == b"HTTP/1.1 200 OK"
    assert _live_sessions(http) == 0
    stats = http.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)
    assert stats.forward_passes - passes < full // 2


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
    status, answer = _post(f"{http.url}/v1/{endpoint}", {"model": MODEL, **body})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param
    assert "Traceback" not in answer["error"]["message"]


def _raw_request(url: str, head: bytes) -> tuple[int, dict]:
    """(status, JSON body) of a request written by hand (head: up to the body, or part of it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += connection.recv(4096)
        headers, _, body = answer.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: (\d+)", headers).group(1))
        while len(body) < length:
            body += connection.recv(4096)
    return int(headers.split()[1]), json.loads(body)


@contextlib.contextmanager
def _stopping_api() -> Iterator[str]:
    """The URL of an HTTP API whose gateway has begun to stop (its stopping event set; no
    backend needed: nothing is asked of them)."""
    from gateway.draft_client import GrpcDraftClient
    from gateway.verifier_client import GrpcVerifierClient

    stopping = threading.Event()
    stopping.set()
    servicer = GatewayServicer(GrpcDraftClient(["127.0.0.1:1"]), GrpcVerifierClient("127.0.0.1:1"))
    api = HttpApiServer(servicer, model_name=MODEL, registry=Metrics().registry, stopping=stopping)
    api.start()
    try:
        yield api.url
    finally:
        api.stop()


def test_a_stopping_gateway_answers_503_to_health_and_requests_but_serves_metrics():
    with _stopping_api() as url:
        status, answer = _request(f"{url}/health")
        assert status == 503 and "shutting down" in answer["error"], answer
        status, answer = _post(f"{url}/v1/chat/completions", {"messages": []})
        assert status == 503 and answer["error"]["type"] == "service_unavailable", answer
        assert "shutting down" in answer["error"]["message"]
        with urllib.request.urlopen(f"{url}/metrics", timeout=60) as metrics:
            assert metrics.status == 200


def _error_table_checks(http: Http) -> dict[str, Callable[[], tuple[int, dict | None]]]:
    """Each row of docs/http-api.md's error table, by its case name: (status, body)."""
    completions = f"{http.url}/v1/completions"
    json_headers = {"Content-Type": "application/json"}

    def too_large() -> tuple[int, dict | None]:
        return _raw_request(
            http.url,
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n{" % (MAX_BODY_BYTES + 1),
        )

    def over_capacity() -> tuple[int, dict | None]:
        # two choices on a gateway with one slot: the second is refused, the first cancelled
        return _post(
            f"{http.busy_url}/v1/completions", {"prompt": PROMPT, "n": 2, "max_tokens": 300}
        )

    def backend_down() -> tuple[int, dict | None]:
        from gateway.draft_client import GrpcDraftClient
        from gateway.verifier_client import GrpcVerifierClient

        servicer = GatewayServicer(
            GrpcDraftClient(["127.0.0.1:1"]), GrpcVerifierClient("127.0.0.1:1")
        )
        api = HttpApiServer(servicer, model_name=MODEL).start()
        try:
            return _post(f"{api.url}/v1/completions", {"prompt": PROMPT})
        finally:
            api.stop()

    def shutting_down() -> tuple[int, dict | None]:
        with _stopping_api() as url:
            return _post(f"{url}/v1/completions", {"prompt": PROMPT})

    def internal() -> tuple[int, dict | None]:
        error = http_error(KeyError("a bug"))
        return error.status, error.body()

    long_prompt = "Once upon a time there was a cat. " * 200
    return {
        "bad-json": lambda: _request(completions, b'{"prompt": "Once', json_headers),
        "not-a-number": lambda: _request(
            completions, b'{"prompt": "Once", "temperature": NaN}', json_headers
        ),
        "too-deep": lambda: _request(
            completions, b'{"prompt": ' + b"[" * 2000 + b"1" + b"]" * 2000 + b"}", json_headers
        ),
        "not-an-object": lambda: _post(completions, ["not", "an", "object"]),
        "unknown-field": lambda: _post(completions, {"prompt": PROMPT, "frobnicate": 1}),
        "wrong-type": lambda: _post(completions, {"prompt": PROMPT, "max_tokens": "ten"}),
        "out-of-range": lambda: _post(completions, {"prompt": PROMPT, "top_p": 1.5}),
        "penalty-out-of-range": lambda: _post(
            completions, {"prompt": PROMPT, "presence_penalty": 2.5}
        ),
        "too-many-choices": lambda: _post(completions, {"prompt": PROMPT, "n": 17}),
        "logprobs-out-of-range": lambda: _post(completions, {"prompt": PROMPT, "logprobs": 6}),
        "unsupported": lambda: _post(completions, {"prompt": PROMPT, "echo": True}),
        "context-length": lambda: _post(completions, {"prompt": long_prompt}),
        "no-token": lambda: _post(f"{http.auth_url}/v1/completions", {"prompt": PROMPT}),
        "wrong-token": lambda: _post(
            f"{http.auth_url}/v1/completions", {"prompt": PROMPT}, {"Authorization": "Bearer x"}
        ),
        "unknown-route": lambda: _request(f"{http.url}/v2/nothing"),
        "wrong-method": lambda: _request(completions),  # a GET
        "too-large": too_large,
        "over-capacity": over_capacity,
        "backend-down": backend_down,
        "shutting-down": shutting_down,
        "internal": internal,
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
    assert _live_sessions(http) == 0
    with pytest.raises(openai.BadRequestError) as excinfo:
        http.client.completions.create(model=MODEL, prompt=PROMPT, top_p=1.5)
    assert excinfo.value.status_code == 400 and excinfo.value.param == "top_p"
    assert _post(f"{http.url}/v1/completions", {"prompt": "x" * 7000})[1]["error"]["code"] == (
        "context_length_exceeded"
    )


def test_bearer_token_is_required_but_health_stays_open(http):
    assert _request(f"{http.auth_url}/health")[0] == 200
    status, answer = _post(f"{http.auth_url}/v1/completions", {"prompt": PROMPT})
    assert status == 401 and answer["error"]["type"] == "authentication_error"
    assert _answer_headers(f"{http.auth_url}/v1/models")["WWW-Authenticate"] == "Bearer"
    bad = openai.OpenAI(base_url=f"{http.auth_url}/v1", api_key="wrong", max_retries=0)
    with bad, pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with openai.OpenAI(base_url=f"{http.auth_url}/v1", api_key=TOKEN, max_retries=0) as good:
        answer = good.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert answer.usage.completion_tokens == 8


@pytest.mark.parametrize(
    "error, status",
    [
        (InvalidArgumentError("k", "bad"), 400),
        (OutOfRangeError("prompt: too long"), 400),
        (RemoteError(grpc.StatusCode.UNAUTHENTICATED, "no"), 401),
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


def test_https_with_the_gateways_certificate(certs):
    """An HTTP API on a TLS gateway serves HTTPS with the same certificate and client CA."""
    from gateway.draft_client import GrpcDraftClient
    from gateway.verifier_client import GrpcVerifierClient

    servicer = GatewayServicer(GrpcDraftClient(["127.0.0.1:1"]), GrpcVerifierClient("127.0.0.1:1"))
    api = HttpApiServer(servicer, tls=server_tls(certs, mutual=True), model_name=MODEL).start()
    try:
        trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        trusted.load_cert_chain(str(certs / "client.pem"), str(certs / "client.key"))
        status, body = _request(f"{api.url}/v1/models", context=trusted)
        assert api.url.startswith("https://") and status == 200
        assert body["data"][0]["id"] == MODEL
        # no backends behind this gateway: 503, not a hang or a 500
        assert _request(f"{api.url}/health", context=trusted)[0] == 503
        status, body = _request(f"{api.url}/v1/completions", b'{"prompt": "Once"}', context=trusted)
        assert status == 503 and body["error"]["type"] == "service_unavailable"
        anonymous = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _request(f"{api.url}/v1/models", context=anonymous)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _request(f"http://{api.address}/v1/models")  # plaintext
    finally:
        api.stop()
