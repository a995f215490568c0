"""OpenAI and vLLM request fields read as constraints and tools (gateway.api.requests),
chat messages with tool calls and tool results (gateway.api.bodies), and the chat
template that shows a model its tools (deploy/chat-templates/chatml-tools.jinja, with
stories260K's tokenizer, which has no template of its own). No servers."""

from __future__ import annotations

import json

import pytest

from gateway.api.requests import parse_openai_request
from gateway.engine import PromptLimits, RequestDefaults
from gateway.generation import PromptRequest
from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError
from speculant.prompting import load_chat_template, render_chat, rendered_with_tools
from speculant.tokenizer import load_tokenizer
from tests.assets import STORIES_MODEL
from tests.structured_http import TOOLS, TOOLS_TEMPLATE, Pet

USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


def _read(chat: bool = True, **fields) -> object:
    body = {"messages": USER} if chat else {"prompt": "Once"}
    return parse_openai_request({**body, **fields}, chat=chat)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize(
    ("fields", "kind", "client_field"),
    [
        ({"response_format": RESPONSE_FORMAT}, "json_schema", "response_format"),
        ({"response_format": {"type": "json_object"}}, "json_object", "response_format"),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", "structured_outputs.json"),
        (
            {"structured_outputs": {"json": json.dumps(SCHEMA)}},
            "json_schema",
            "structured_outputs.json",
        ),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "regex", "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "choice", "structured_outputs.choice"),
        (
            {"structured_outputs": {"grammar": 'start: "a"'}},
            "grammar",
            "structured_outputs.grammar",
        ),
        (
            {"structured_outputs": {"json_object": True}},
            "json_object",
            "structured_outputs.json_object",
        ),
        ({"guided_json": json.dumps(SCHEMA)}, "json_schema", "guided_json"),
        ({"guided_regex": "[0-9]+"}, "regex", "guided_regex"),
        ({"guided_choice": ["yes", "no"]}, "choice", "guided_choice"),
        ({"guided_grammar": 'start: "a"'}, "grammar", "guided_grammar"),
    ],
)
def test_each_field_is_a_constraint_and_its_errors_name_it(chat, fields, kind, client_field):
    request = _read(chat, **fields)
    constraint = request.generates[0].constraint
    assert constraint.kind == kind
    if kind == "json_schema":
        assert json.loads(constraint.text) == SCHEMA
    assert request.client_field(constraint.field) == client_field
    assert request.client_field("constraint") == client_field


def test_text_and_none_constrain_nothing():
    assert _read(response_format={"type": "text"}).generates[0].constraint is None
    request = _read(tools=TOOLS, tool_choice="none")
    assert request.generates[0].constraint is None and request.generates[0].tools == ()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": RESPONSE_FORMAT, "guided_regex": "a"}, "guided_regex"),
        ({"guided_json": SCHEMA, "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"response_format": RESPONSE_FORMAT, "tools": TOOLS, "tool_choice": "required"}, "tools"),
        ({"structured_outputs": {"jsn": SCHEMA}}, "structured_outputs.jsn"),
        ({"structured_outputs": "json"}, "structured_outputs"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": "yes"}, "guided_choice"),
        ({"guided_regex": 5}, "guided_regex"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ],
)
def test_malformed_or_competing_constraints_are_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidArgumentError) as error:
        _read(**fields)
    assert error.value.field == param
    if "both constrain" in error.value.problem:
        assert "give one of them" in error.value.problem


def test_a_tool_schema_the_engine_cannot_compile_is_named_with_its_reason():
    bad = {"type": "function", "function": {"name": "tags", "parameters": {"uniqueItems": True}}}
    with pytest.raises(InvalidArgumentError) as error:
        _read(tools=[*TOOLS, bad], tool_choice="required")
    assert error.value.field == "tools[2].function.parameters"
    assert error.value.problem == 'Unimplemented keys: ["uniqueItems"]'
    named = _read(
        tools=[*TOOLS, bad], tool_choice={"type": "function", "function": {"name": "tags"}}
    )
    assert named.client_field("constraint.json_schema") == "tools[2].function.parameters"


def test_tools_are_not_fields_of_a_completion():
    with pytest.raises(InvalidArgumentError) as error:
        _read(chat=False, tools=TOOLS)
    assert error.value.field == "tools"


def test_messages_with_tool_calls_and_tool_results_take_the_templates_form():
    arguments = json.dumps({"city": "Paris", "days": 2})
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    messages = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        },
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    read = _read(messages=messages).generates[0].messages
    assert read[0] == {"role": "system", "content": "Be brief."}
    assert read[2]["content"] is None and "refusal" not in read[2]
    assert read[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris", "days": 2},
    }
    assert read[3] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {"role": "assistant", "tool_calls": [{"function": {"name": 3, "arguments": "{}"}}]},
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {"role": "assistant", "tool_calls": [{"type": "function"}]},
            "messages[0].tool_calls[0].function",
        ),
        ({"role": "user", "content": None}, "messages[0].content"),
        ({"role": "user", "content": "a", "tool_calls": [{}]}, "messages[0].tool_calls"),
        ({"role": "tool", "content": "a", "tool_call_id": 7}, "messages[0].tool_call_id"),
        ({"role": "user", "content": [{"type": "image_url"}]}, "messages[0].content[0]"),
    ],
)
def test_bad_messages_are_refused_naming_the_field(message, param):
    with pytest.raises(InvalidArgumentError) as error:
        _read(messages=[message])
    assert error.value.field == param


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(str(STORIES_MODEL))


def test_the_tools_template_shows_tools_and_renders_calls_and_results(tokenizer):
    template = load_chat_template(TOOLS_TEMPLATE)
    messages = (
        _read(
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "rain"},
            ]
        )
        .generates[0]
        .messages
    )
    text = render_chat(tokenizer, messages, TOOLS, template)
    assert "<tools>\n" + json.dumps(TOOLS[0]) in text
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' in text
    )
    assert "<|im_start|>user\n<tool_response>\nrain\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert rendered_with_tools(tokenizer, messages, TOOLS, template)
    assert not rendered_with_tools(
        tokenizer, messages, TOOLS, "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    )


def _prepare(tokenizer, template: str | None, **request) -> list[int]:
    defaults = RequestDefaults(chat_template=template)
    return defaults.prepare(
        PromptRequest(messages=tuple(USER), **request), tokenizer, PromptLimits(512, 512)
    ).prompt_ids


def test_auto_needs_a_template_that_shows_the_tools(tokenizer):
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tools = tuple(TOOLS)
    with pytest.raises(InvalidArgumentError) as error:
        _prepare(tokenizer, plain, tools=tools, tools_must_show=True)
    assert error.value.field == "tool_choice" and "--chat-template" in error.value.problem
    assert _prepare(tokenizer, plain, tools=tools)  # required and named need not show them
    template = load_chat_template(TOOLS_TEMPLATE)
    with_tools = _prepare(tokenizer, template, tools=tools, tools_must_show=True)
    assert len(with_tools) > len(_prepare(tokenizer, template))


def test_a_template_that_cannot_render_the_messages_is_a_bad_request(tokenizer):
    strict = "{% for m in messages %}{{ m['role'] + m['content'] }}{% endfor %}"  # as SmolLM2's
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(InvalidArgumentError) as error:
        render_chat(tokenizer, messages, None, strict)
    assert error.value.field == "messages" and "cannot render" in error.value.problem


def test_a_chat_template_file_is_checked_when_it_is_loaded(tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m }}")
    for path in (broken, tmp_path / "missing.jinja"):
        with pytest.raises(InvalidArgumentError) as error:
            load_chat_template(path)
        assert error.value.field == "--chat-template" and str(path) in error.value.problem


def test_pydantic_schemas_are_constraints():
    request = _read(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "pet", "schema": Pet.model_json_schema(), "strict": True},
        }
    )
    assert request.generates[0].constraint == Constraint(
        "json_schema", json.dumps(Pet.model_json_schema())
    )
