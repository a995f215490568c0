"""Structured outputs over the HTTP API with stories260K (real services on localhost ports):
OpenAI's ``response_format`` and vLLM's ``structured_outputs`` / ``guided_*`` on both routes,
streamed and not, ``POST /generate``'s ``constraint``, and the errors: a schema the engine cannot
compile, two constraints, a generation cut inside a value. Answers are validated by the Pydantic
model their schema came from."""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.e2e import verifier_config
from tests.fixtures.http_api import CHAT_TEMPLATE
from tests.http_calls import post_json
from tests.structured_http import Pet, http_apis

MESSAGES = [{"role": "user", "content": "Tell me about a pet."}]
PET_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "pet", "schema": Pet.model_json_schema(), "strict": True},
}
LARK = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'


@pytest.fixture(scope="module")
def api(tinystories_graph):
    with http_apis(
        tinystories_graph, verifier_config(), [{"chat_template": CHAT_TEMPLATE}]
    ) as apis:
        yield apis[0]


def _ask(api, route: str, **fields) -> tuple[int, dict]:
    body = {"messages": MESSAGES} if route == "chat/completions" else {"prompt": "Once upon a time"}
    return post_json(f"{api.url}/v1/{route}", {"max_tokens": 100, **body, **fields})


def _text(answer: dict) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
@pytest.mark.parametrize("temperature", [0, 1])
def test_response_format_json_schema_answers_valid_json(api, route, temperature):
    status, answer = _ask(api, route, response_format=PET_FORMAT, temperature=temperature, seed=3)
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "stop"
    Pet.model_validate_json(_text(answer))


def test_the_openai_client_parses_a_json_schema_answer(api):
    completion = api.client.chat.completions.parse(
        model="model", messages=MESSAGES, response_format=Pet, max_tokens=100, temperature=0
    )
    assert isinstance(completion.choices[0].message.parsed, Pet)


def test_a_streamed_json_schema_answer_concatenates_to_the_unary_json(api):
    _, unary = _ask(api, "chat/completions", response_format=PET_FORMAT, temperature=0)
    chunks = api.client.chat.completions.create(
        model="model",
        messages=MESSAGES,
        response_format=PET_FORMAT,
        max_tokens=100,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _text(unary)
    Pet.model_validate_json(text)


@pytest.mark.parametrize(
    ("fields", "check"),
    [
        ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
        (
            {"structured_outputs": {"regex": "(yes|no), [a-z]{1,8}"}},
            lambda t: re.fullmatch("(yes|no), [a-z]{1,8}", t),
        ),
        ({"guided_choice": ["cat", "dog"]}, lambda t: t in ("cat", "dog")),
        ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
        ({"guided_grammar": LARK}, lambda t: t in ("The answer is yes.", "The answer is no.")),
        ({"structured_outputs": {"grammar": LARK}}, lambda t: t.startswith("The answer is ")),
        ({"guided_json": json.dumps(Pet.model_json_schema())}, Pet.model_validate_json),
        ({"structured_outputs": {"json": Pet.model_json_schema()}}, Pet.model_validate_json),
    ],
)
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_vllm_fields_constrain_the_answer(api, route, fields, check):
    status, answer = _ask(api, route, temperature=1, seed=11, **fields)
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert check(_text(answer))


def test_json_object_answers_an_object_or_a_cut_one(api):
    status, answer = _ask(
        api, "completions", response_format={"type": "json_object"}, max_tokens=40
    )
    assert status == 200, answer
    text, finish = _text(answer), answer["choices"][0]["finish_reason"]
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    status, answer = _ask(
        api, "chat/completions", structured_outputs={"json_object": True}, max_tokens=40
    )
    assert status == 200 and _text(answer).startswith("{")


def test_a_generation_cut_inside_a_value_finishes_with_length(api):
    status, answer = _ask(api, "chat/completions", response_format=PET_FORMAT, max_tokens=4)
    assert status == 200
    assert answer["choices"][0]["finish_reason"] == "length"
    assert _text(answer).startswith('{"')
    chunks = list(
        api.client.chat.completions.create(
            model="model", messages=MESSAGES, response_format=PET_FORMAT, max_tokens=4, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("fields", "param", "reason"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}},
                }
            },
            "response_format",
            'Unimplemented keys: ["uniqueItems"]',
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "thing"}},
                }
            },
            "response_format",
            "Invalid type",
        ),
        (
            {"structured_outputs": {"json": {"type": "string", "pattern": "(unclosed"}}},
            "structured_outputs.json",
            "",
        ),
        ({"guided_regex": "(a|b"}, "guided_regex", ""),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", ""),
        ({"guided_choice": []}, "guided_choice", ""),
        (
            {"response_format": PET_FORMAT, "guided_choice": ["a"]},
            "guided_choice",
            "both constrain",
        ),
    ],
)
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_a_constraint_that_does_not_compile_is_a_400_naming_the_clients_field(
    api, route, fields, param, reason
):
    for stream in (False, True):
        status, answer = _ask(api, route, stream=stream, **fields)
        assert status == 400, answer
        assert answer["error"]["param"] == param
        assert answer["error"]["message"].startswith(f"{param}: ")
        assert reason in answer["error"]["message"]


def test_generate_takes_a_constraint_as_grpcurl_writes_it(api):
    body = {
        "prompt": "Once upon a time",
        "maxTokens": 30,
        "constraint": {"regex": "[a-z]{4} [0-9]"},
    }
    status, answer = post_json(f"{api.url}/generate", body)
    assert status == 200, answer
    assert re.fullmatch("[a-z]{4} [0-9]", answer["text"]) and answer["finish_reason"] == "eos"
    status, answer = post_json(f"{api.url}/generate", {**body, "constraint": {"regex": "(a"}})
    assert status == 400 and answer["error"]["param"] == "constraint.regex"
    status, answer = post_json(
        f"{api.url}/generate",
        {
            **body,
            "maxTokens": 100,
            "constraint": {"jsonSchema": json.dumps(Pet.model_json_schema())},
        },
    )
    assert status == 200 and Pet.model_validate_json(answer["text"])
