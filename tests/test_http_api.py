"""The gateway's HTTP API (gateway.api.app) with the official `openai` client and urllib.

Real draft, verifier and gateway servers on localhost ports (the ``http`` fixture,
tests/fixtures/http_api.py), and the HTTP API on the same GenerationEngine as the gRPC gateway:
completions (unary and streamed) must give exactly the text of gRPC Generate for the same
request, and chat completions render messages with the tokenizer's chat template (stories260K
has none, so the gateway there loads a copy of its tokenizer with a small template: same
vocabulary, same fingerprint). Its errors are in test_http_errors.py, its bearer token and
HTTPS in test_http_access.py.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import urllib.request

import pytest

from gateway.api.requests import choice_seed
from speculant.client import generate_request
from speculant.v1 import gateway_pb2, verifier_pb2
from tests.http_calls import (
    MODEL,
    PROMPT,
    answer_headers,
    fetch_json,
    live_sessions,
    post_json,
)


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
    answer = post_json(
        f"{http.url}/v1/completions",
        {"prompt": [PROMPT, other_ids], "n": 2, "seed": 7, **sampling},
    )[1]
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]

    def single(prompt, seed):
        return post_json(
            f"{http.url}/v1/completions", {"prompt": prompt, "seed": seed, **sampling}
        )[1]

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
    assert live_sessions(http) == 0


def test_logprobs_in_openai_shapes_match_the_tokens(http):
    """Greedy: each token is the most likely, its logprob the top alternative's, all <= 0; the
    token texts spell the text; the stream reports the same as the unary answer."""
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 3}
    unary = post_json(f"{http.url}/v1/completions", body)[1]
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
    generated = post_json(
        f"{http.url}/generate",
        {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "top_logprobs": 3},
    )[1]
    # The same tokens, scored in other forward shapes (cost-sized drafts follow the machine's
    # timings, and the draft tier has learned from the first answer): logits agree to ~1e-5.
    assert [e["logprob"] for e in generated["logprobs"]] == pytest.approx(
        logprobs["token_logprobs"], abs=1e-4
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
    post_json(f"{http.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0})
    with urllib.request.urlopen(f"{http.url}/metrics", timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    finished = re.search(
        r'^speculant_gateway_generations_total\{finish_reason="max_tokens"\} (\S+)',
        text,
        re.MULTILINE,
    )
    assert finished and float(finished.group(1)) >= 1
    assert fetch_json(f"{http.auth_url}/metrics")[0] == 404  # that server was given no registry


def test_generate_and_health_and_models(http):
    status, body = post_json(
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
    assert fetch_json(f"{http.url}/health") == (200, {"status": "ok", "model": MODEL})
    # the model, then one <model>:<graph> entry per graph the draft tier serves
    assert [m.id for m in http.client.models.list()] == [MODEL, f"{MODEL}:tinystories"]
    assert live_sessions(http) == 0


def test_every_answer_carries_its_request_id_and_the_logs_name_it(http, caplog):
    from speculant.request_context import RequestIdFilter

    caplog.set_level(logging.INFO, logger="gateway.api.app")
    caplog.handler.addFilter(RequestIdFilter())  # as the service's log handler has it
    body = json.dumps({"prompt": PROMPT, "max_tokens": 4, "temperature": 0}).encode()
    json_headers = {"Content-Type": "application/json"}
    given = answer_headers(f"{http.url}/generate", body, {**json_headers, "X-Request-Id": "req-42"})
    assert given["X-Request-Id"] == "req-42"
    made = answer_headers(f"{http.url}/generate", body, json_headers)["X-Request-Id"]
    assert len(made) == 32 and int(made, 16) >= 0  # a new id: uuid4 hex
    bad = answer_headers(f"{http.url}/nope", None, {"X-Request-Id": "bad id with spaces"})
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
    full = post_json(f"{http.url}/v1/completions", body)[1]["speculant_stats"]["rounds"]
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
    assert live_sessions(http) == 0
    stats = http.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)
    assert stats.forward_passes - passes < full // 2
