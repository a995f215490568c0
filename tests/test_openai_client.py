"""The official `openai` client against `speculant up` with its defaults (only the ports are
free ones instead of 50050..50052 and 8000): completions and chat, with top_p, n=2 and
logprobs, streamed and not.

The model is a copy of the demo kit's stories260K with a small chat template added (it has
none, and chat needs one); the graph is built from the demo kit's tinystories slice.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from speculant.ports import free_ports
from tests.assets import STORIES_MODEL

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPT = "Once upon a time, there was a little girl named Lily."
MESSAGES = [{"role": "user", "content": "Tell me a story about a cat."}]


def _model_with_chat_template(folder: Path) -> Path:
    shutil.copytree(STORIES_MODEL, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def client(tinystories_graph, tmp_path_factory) -> Iterator[openai.OpenAI]:
    model = _model_with_chat_template(tmp_path_factory.mktemp("model") / "stories260K")
    gateway, draft, verifier, http = free_ports(4)
    command = [sys.executable, "-m", "launcher.cli", "up"]
    command += ["--graph", str(tinystories_graph), "--model", str(model)]
    command += ["--gateway-port", str(gateway), "--draft-port", str(draft)]
    command += ["--verifier-port", str(verifier), "--http-port", str(http)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("HTTP API: "):
                break
        url = lines[-1].split()[2] if lines else ""
        assert url == f"http://127.0.0.1:{http}", lines
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as api:
            yield api
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def _check_completion_logprobs(text: str, logprobs, tokens: int, top: int) -> None:
    """The logprobs of one completion choice: one per token, <= 0, spelling the text."""
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == tokens > 0
    assert "".join(logprobs.tokens) == text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert len(logprobs.top_logprobs) == tokens
    for alternatives in logprobs.top_logprobs:
        assert 1 <= len(alternatives) <= top and all(v <= 0 for v in alternatives.values())
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)


def test_completions_with_top_p_n_and_logprobs(client):
    answer = client.completions.create(
        model="any",
        prompt=PROMPT,
        n=2,
        top_p=0.9,
        temperature=1.0,
        logprobs=2,
        max_tokens=16,
        seed=5,
    )
    assert sorted(c.index for c in answer.choices) == [0, 1]
    tokens = 0
    for choice in answer.choices:
        count = len(choice.logprobs.tokens)
        _check_completion_logprobs(choice.text, choice.logprobs, count, 2)
        tokens += count
    assert answer.usage.completion_tokens == tokens
    greedy = client.completions.create(
        model="any", prompt=PROMPT, n=2, temperature=0, logprobs=3, max_tokens=12
    )
    first, second = greedy.choices
    assert first.text == second.text  # greedy: both choices are the argmax path
    for token, logprob, alternatives in zip(
        first.logprobs.tokens,
        first.logprobs.token_logprobs,
        first.logprobs.top_logprobs,
        strict=True,
    ):
        assert alternatives[token] == pytest.approx(logprob) == max(alternatives.values())


def test_streamed_completions_interleave_their_choices(client):
    texts: dict[int, str] = {0: "", 1: ""}
    tokens: dict[int, list[str]] = {0: [], 1: []}
    finished: dict[int, str] = {}
    stream = client.completions.create(
        model="any",
        prompt=PROMPT,
        n=2,
        top_p=0.9,
        logprobs=1,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.logprobs is not None:
                tokens[choice.index] += choice.logprobs.tokens
                assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    assert set(finished) == {0, 1} and set(finished.values()) <= {"stop", "length"}
    for index in (0, 1):
        assert texts[index] and "".join(tokens[index]) == texts[index]
    assert usage.completion_tokens == len(tokens[0]) + len(tokens[1])


def test_chat_with_top_p_n_and_logprobs_streamed_and_not(client):
    answer = client.chat.completions.create(
        model="any",
        messages=MESSAGES,
        n=2,
        top_p=0.9,
        logprobs=True,
        top_logprobs=2,
        max_completion_tokens=12,
    )
    assert sorted(c.index for c in answer.choices) == [0, 1]
    for choice in answer.choices:
        content = choice.logprobs.content
        assert content and "".join(t.token for t in content) == choice.message.content
        for entry in content:
            # at most 2 alternatives: fewer where top_p leaves fewer tokens
            values = [t.logprob for t in entry.top_logprobs]
            assert entry.logprob <= 0 and 1 <= len(values) <= 2 and values == sorted(values)[::-1]
    assert answer.usage.completion_tokens == sum(len(c.logprobs.content) for c in answer.choices)
    roles, texts, tokens = {}, {0: "", 1: ""}, {0: [], 1: []}
    for chunk in client.chat.completions.create(
        model="any",
        messages=MESSAGES,
        n=2,
        top_p=0.9,
        logprobs=True,
        max_tokens=12,
        stream=True,
    ):
        for choice in chunk.choices:
            if choice.delta.role:
                roles[choice.index] = choice.delta.role
            texts[choice.index] += choice.delta.content or ""
            if choice.logprobs is not None:
                tokens[choice.index] += [t.token for t in choice.logprobs.content]
    assert roles == {0: "assistant", 1: "assistant"}
    for index in (0, 1):
        assert texts[index] and "".join(tokens[index]) == texts[index]
