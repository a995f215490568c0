"""The gateway's HTTP API (gateway.http_api) with the official `openai` client and urllib.

Real draft, verifier and gateway servers on localhost ports, and the HTTP API on the same
GatewayServicer as the gRPC gateway: completions (unary and streamed) must give exactly the
text of gRPC Generate for the same request, chat completions render messages with the
tokenizer's chat template (stories260K has none, so the gateway here loads a copy of its
tokenizer with a small template: same vocabulary, same fingerprint), and errors are
OpenAI-style JSON naming the field.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import openai
import pytest

from gateway.http_api import HttpApiServer, http_error
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
from speculant.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.conftest import STORIES_MODEL
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
    gateway_server, servicer = start_gateway(
        [draft.address], verifier_server.address, port=0, tokenizer_name=str(tokenizer)
    )
    api = HttpApiServer(servicer, model_name=MODEL).start()
    auth_api = HttpApiServer(servicer, auth_token=TOKEN, model_name=MODEL).start()
    channels = [grpc.insecure_channel(a) for a in (gateway_server.address, verifier_server.address)]
    client = openai.OpenAI(base_url=f"{api.url}/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        yield Http(
            api.url,
            auth_api.url,
            gateway_pb2_grpc.GatewayServiceStub(channels[0]),
            verifier_pb2_grpc.VerifierServiceStub(channels[1]),
            client,
        )
    finally:
        client.close()
        for channel in channels:
            channel.close()
        auth_api.stop()
        api.stop()
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
        ("completions", {"prompt": PROMPT, "n": 2}, "n"),
        ("completions", {"prompt": PROMPT, "max_tokens": -1}, "max_tokens"),
        ("completions", {"prompt": PROMPT, "max_tokens": "ten"}, "max_tokens"),
        ("completions", {"prompt": PROMPT, "top_p": 0.5}, "top_p"),
        ("completions", {"prompt": PROMPT, "temperature": -1}, "temperature"),
        ("completions", {"prompt": PROMPT, "seed": -3}, "seed"),
        ("completions", {"prompt": PROMPT, "stop": [1]}, "stop"),
        ("completions", {"prompt": PROMPT, "speculant": {"k": 0}}, "speculant.k"),
        ("completions", {"prompt": PROMPT, "speculant": {"kk": 2}}, "speculant.kk"),
        ("completions", {"prompt": PROMPT, "frobnicate": 1}, "frobnicate"),
        ("completions", {"prompt": ["a", "b"]}, "prompt"),
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
    ],
)
def test_bad_parameters_are_400_naming_the_field(http, endpoint, body, param):
    status, answer = _post(f"{http.url}/v1/{endpoint}", {"model": MODEL, **body})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == param
    assert "Traceback" not in answer["error"]["message"]


def test_errors_through_the_openai_client_and_urllib(http):
    with pytest.raises(openai.BadRequestError) as excinfo:
        http.client.completions.create(model=MODEL, prompt=PROMPT, n=2)
    assert excinfo.value.status_code == 400 and excinfo.value.param == "n"
    status, answer = _request(
        f"{http.url}/v1/completions", b'{"prompt": "Once', {"Content-Type": "application/json"}
    )
    assert status == 400 and "invalid JSON" in answer["error"]["message"]
    assert _post(f"{http.url}/v1/completions", ["not", "an", "object"])[0] == 400
    long_prompt = "Once upon a time there was a cat. " * 200
    status, answer = _post(f"{http.url}/v1/completions", {"prompt": long_prompt})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert _request(f"{http.url}/v2/nothing")[0] == 404
    assert _request(f"{http.url}/v1/completions")[0] == 405  # a GET
    assert _live_sessions(http) == 0


def test_bearer_token_is_required_but_health_stays_open(http):
    assert _request(f"{http.auth_url}/health")[0] == 200
    status, answer = _post(f"{http.auth_url}/v1/completions", {"prompt": PROMPT})
    assert status == 401 and answer["error"]["type"] == "authentication_error"
    wrong = {"Authorization": "Bearer wrong"}
    assert _post(f"{http.auth_url}/generate", {"prompt": PROMPT}, wrong)[0] == 401
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
