"""Tools on ``/v1/chat/completions`` with stories260K (real services on localhost ports), through
the official OpenAI client: ``tool_choice`` ``required`` and a named function answer
``tool_calls`` whose arguments validate against the tool's schema (unary, and streamed
``delta.tool_calls`` as the client accumulates them), ``auto`` needs a chat template that shows
the tools (``--chat-template``), messages with tool calls and tool results are rendered, and a
call cut by ``max_tokens`` is content with the finish reason ``length``."""

from __future__ import annotations

import json

import openai
import pytest

from speculant.prompting import load_chat_template, render_chat
from speculant.tokenizer import load_tokenizer
from tests.assets import STORIES_MODEL
from tests.fixtures.e2e import verifier_config
from tests.fixtures.http_api import CHAT_TEMPLATE
from tests.http_calls import post_json
from tests.structured_http import TOOL_MODELS, TOOLS, TOOLS_TEMPLATE, http_apis

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "set_alarm"}}
# stories260K's context is 512 tokens: the tools the template shows it must be small
SMALL_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer", "maximum": 9}},
            },
        },
    }
]


@pytest.fixture(scope="module")
def apis(tinystories_graph):
    """A gateway whose chat template does not show tools, and one with chatml-tools.jinja."""
    templates = [CHAT_TEMPLATE, load_chat_template(TOOLS_TEMPLATE)]
    gateways = [{"chat_template": t} for t in templates]
    with http_apis(tinystories_graph, verifier_config(), gateways) as running:
        yield running


def _create(api, **fields):
    options = {"model": "model", "messages": MESSAGES, "max_tokens": 100, "temperature": 0}
    return api.client.chat.completions.create(**{**options, **fields})


def _check_calls(message, names: set[str]) -> list[tuple[str, str]]:
    """The message's calls (name, arguments), each valid against its tool's schema."""
    assert message.tool_calls
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        TOOL_MODELS[call.function.name].model_validate_json(call.function.arguments)
        calls.append((call.function.name, call.function.arguments))
    return calls


# stories260K, asked for calls in an array of any length, never closes it (it calls again and
# again until max_tokens): the answer with parallel calls is tested on fixed texts
# (tests/test_tool_stream.py) and with SmolLM2 (tests/test_smollm2_structured.py)
@pytest.mark.parametrize(
    ("choice", "names", "parallel"),
    [
        ("required", {"get_weather", "set_alarm"}, False),
        (NAMED, {"set_alarm"}, True),
        (NAMED, {"set_alarm"}, False),
    ],
    ids=["required", "named", "named-one"],
)
def test_required_and_named_answer_tool_calls_valid_against_the_tools_schema(
    apis, choice, names, parallel
):
    answer = _create(apis[0], tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel)
    choice0 = answer.choices[0]
    assert choice0.finish_reason == "tool_calls"
    assert choice0.message.content is None and choice0.message.role == "assistant"
    assert len(_check_calls(choice0.message, names)) == 1


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_streamed_tool_calls_accumulate_into_the_unary_answer(apis, choice):
    one = {"parallel_tool_calls": False}
    unary = _create(apis[0], tools=TOOLS, tool_choice=choice, seed=5, temperature=1, **one)
    with apis[0].client.chat.completions.stream(
        model="model",
        messages=MESSAGES,
        max_tokens=100,
        temperature=1,
        seed=5,
        tools=TOOLS,
        tool_choice=choice,
        **one,
    ) as stream:
        streamed = stream.get_final_completion()
    names = set(TOOL_MODELS)
    assert _check_calls(streamed.choices[0].message, names) == _check_calls(
        unary.choices[0].message, names
    )
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert streamed.choices[0].message.content is None


def test_auto_without_a_template_that_shows_tools_is_a_400_naming_tool_choice(apis):
    for tool_choice in ("auto", None):  # auto is the default with tools
        fields = {"tools": TOOLS} | ({"tool_choice": tool_choice} if tool_choice else {})
        with pytest.raises(openai.BadRequestError) as error:
            _create(apis[0], **fields)
        body = error.value.body
        assert body["param"] == "tool_choice"
        assert "--chat-template" in body["message"] and "'required'" in body["message"]


def test_auto_with_the_tools_template_answers_text_or_calls(apis):
    answer = _create(apis[1], tools=SMALL_TOOLS, tool_choice="auto", max_tokens=40)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        assert choice.message.tool_calls[0].function.name == "f"
    else:
        assert choice.message.content and not choice.message.tool_calls


def test_tool_calls_and_tool_results_are_rendered_by_the_template(apis):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": json.dumps({"x": 3})},
    }
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "It is sunny."},
    ]
    answer = _create(
        apis[1], messages=messages, tools=SMALL_TOOLS, tool_choice="none", max_tokens=8
    )
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    read = [
        MESSAGES[0],
        {**messages[1], "tool_calls": [{**call, "function": {"name": "f", "arguments": {"x": 3}}}]},
        messages[2],
    ]
    rendered = render_chat(tokenizer, read, None, load_chat_template(TOOLS_TEMPLATE))
    assert "<tool_response>\nIt is sunny.\n</tool_response>" in rendered
    assert answer.usage.prompt_tokens == len(
        tokenizer(rendered, add_special_tokens=False).input_ids
    )


def test_a_call_cut_by_max_tokens_is_content_with_the_finish_reason_length(apis):
    answer = _create(apis[0], tools=TOOLS, tool_choice="required", max_tokens=6)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content.startswith('[{"')
    chunks = list(_create(apis[0], tools=TOOLS, tool_choice=NAMED, max_tokens=3, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"


def test_a_tool_schema_the_engine_cannot_compile_is_a_400_naming_the_tool(apis):
    tags = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    bad = {"type": "function", "function": {"name": "tag", "parameters": tags}}
    for choice in ("required", {"type": "function", "function": {"name": "tag"}}):
        status, answer = post_json(
            f"{apis[0].url}/v1/chat/completions",
            {"messages": MESSAGES, "tools": [*TOOLS, bad], "tool_choice": choice},
        )
        assert status == 400, answer
        assert answer["error"]["param"] == "tools[2].function.parameters"
        assert 'Unimplemented keys: ["uniqueItems"]' in answer["error"]["message"]
