"""Tool calls read back from fixed texts, whole and streamed (speculant.tool_stream,
speculant.structured.ToolCalling.parse), the deltas the HTTP API streams them as (accumulated by
the official OpenAI client's own stream state), and the grammar of ``tool_choice: "auto"`` on
fixed texts: it lets the model write free text, and constrains a call's arguments once the
``<tool_call>`` tag is written. No servers."""

from __future__ import annotations

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from gateway.api.answers import ResponseWriter
from gateway.api.requests import parse_openai_request
from gateway.generation import FinishReason, GenerationResult, GenerationStats
from speculant.errors import InvalidArgumentError
from speculant.structured import ToolCall, tool_calling
from tests.structured_http import TOOLS

NAMED = {"type": "function", "function": {"name": "set_alarm"}}
WEATHER = '{"city":"Paris","days":3}'

# (tool_choice, text, content, calls as (name, arguments))
CASES = [
    (NAMED, '{"hour":7,"loud":true}', None, [("set_alarm", '{"hour":7,"loud":true}')]),
    (NAMED, '{"hour":7,"lo', '{"hour":7,"lo', []),  # cut by max_tokens: the text is content
    (
        "required",
        f'[{{"name":"get_weather","parameters":{WEATHER}}},'
        '{"name":"set_alarm","parameters":{"hour":23,"loud":false}}]',
        None,
        [("get_weather", WEATHER), ("set_alarm", '{"hour":23,"loud":false}')],
    ),
    (
        "required",
        '[{"name":"get_weather","parameters":{"city":"Pa',
        '[{"name":"get_weather","parameters":{"city":"Pa',
        [],
    ),
    # another key order: read whole once the call ends
    (
        "required",
        f'[{{"parameters":{WEATHER},"name":"get_weather"}}]',
        None,
        [("get_weather", WEATHER)],
    ),
    (
        "auto",
        'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 3}}\n</tool_call>\n',
        "Let me look.",
        [("get_weather", WEATHER)],
    ),
    (
        "auto",
        '<tool_call>{"name": "set_alarm", "arguments": {"hour": 7, "loud": true}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "a \\"b\\" } c", "days": 1}}'
        "</tool_call>",
        None,
        [
            ("set_alarm", '{"hour":7,"loud":true}'),
            ("get_weather", '{"city":"a \\"b\\" } c","days":1}'),
        ],
    ),
    ("auto", "a < b, and <tool c> is no tag.  ", "a < b, and <tool c> is no tag.", []),
    (
        "auto",
        'Sure. <tool_call>{"name": "get_weather", "arguments": {"ci',
        'Sure. <tool_call>{"name": "get_weather", "arguments": {"ci',
        [],
    ),
]


def _calling(choice):
    return tool_calling(TOOLS, choice)


@pytest.mark.parametrize(("choice", "text", "content", "calls"), CASES)
def test_the_text_of_each_form_is_read_as_content_and_calls(choice, text, content, calls):
    assert _calling(choice).parse(text) == (content, [ToolCall(*c) for c in calls])


def _streamed(calling, text: str, step: int) -> tuple[str, dict[int, list[str]]]:
    reader = calling.reader()
    pieces = []
    for start in range(0, len(text), step):
        pieces += reader.feed(text[start : start + step])
    pieces += reader.finish()
    content = "".join(p.content for p in pieces if p.index < 0)
    calls: dict[int, list[str]] = {}
    for piece in pieces:
        if piece.index >= 0:
            name, arguments = calls.setdefault(piece.index, ["", ""])
            calls[piece.index] = [name + piece.name, arguments + piece.arguments]
    return content, calls


# the texts not cut short (a cut call was streamed as a call before the cut)
WHOLE = [c for c in CASES if c[3] or (c[0] == "auto" and "<tool_call>" not in c[1])]


@pytest.mark.parametrize(("choice", "text", "content", "calls"), WHOLE)
@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_a_streamed_text_gives_the_content_and_calls_of_the_whole_text(
    choice, text, content, calls, step
):
    streamed_content, streamed = _streamed(_calling(choice), text, step)
    assert streamed == {i: list(call) for i, call in enumerate(calls)}
    assert streamed_content == (content or "")


def _chunks(writer: ResponseWriter, text: str, step: int) -> list[dict]:
    chunks = writer.opening_chunks(1)
    for start in range(0, len(text), step):
        chunks += writer.text_chunks(0, text[start : start + step])
    result = GenerationResult(text, [1] * len(text), FinishReason.EOS, GenerationStats())
    return chunks + writer.final_chunks(0, result)


@pytest.mark.parametrize("case", [0, 2, 5, 6], ids=["named", "required", "auto", "auto-two"])
def test_the_openai_client_accumulates_the_streamed_calls_into_the_unary_message(case):
    choice, text, content, calls = CASES[case]
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": choice}
    request = parse_openai_request({**body, "stream": True}, chat=True)
    unary = ResponseWriter(request, "model").response(
        [GenerationResult(text, [1], FinishReason.EOS, GenerationStats())], [[]]
    )["choices"][0]
    state = ChatCompletionStreamState()
    for chunk in _chunks(ResponseWriter(request, "model"), text, 3):
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    streamed = state.get_final_completion().choices[0]
    assert unary["finish_reason"] == streamed.finish_reason == "tool_calls"
    assert unary["message"]["content"] == streamed.message.content == content
    got = [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls]
    want = [
        (c["function"]["name"], c["function"]["arguments"]) for c in unary["message"]["tool_calls"]
    ]
    assert got == want == calls
    assert all(
        c.id.startswith("call_") and c.type == "function" for c in streamed.message.tool_calls
    )


def test_a_call_cut_short_is_content_with_the_finish_reason_length():
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": NAMED}
    request = parse_openai_request(body, chat=True)
    text = '{"hour":7,"lo'
    result = GenerationResult(text, [1], FinishReason.MAX_TOKENS, GenerationStats())
    choice = ResponseWriter(request, "model").response([result], [[]])["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": text}


def _grammar_allows(grammars, tokenizer, constraint, text: str) -> bool:
    matcher = grammars.matcher(constraint)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    for token in ids:
        if not matcher.allows(token):
            return False
        matcher.consume([token])
    return matcher.allows(tokenizer.eos_token_id)


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ("Once upon a time, there was no tool at all.", True),
        (CASES[5][1], True),
        (CASES[5][1].replace('"days": 3', '"days": 30'), False),  # over the schema's maximum
        (CASES[5][1].replace('"get_weather"', '"get_time"'), False),  # not a tool
        ('Hi <tool_call>{"name": "set_alarm", "arguments": {"hour": "7"}}</tool_call>', False),
    ],
)
def test_auto_lets_the_model_write_text_and_constrains_a_call_once_its_tag_is_written(
    text, allowed
):
    from speculant.grammar import grammars_for
    from speculant.tokenizer import load_tokenizer
    from tests.assets import STORIES_MODEL

    tokenizer = load_tokenizer(str(STORIES_MODEL))
    grammars = grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    constraint = _calling("auto").constraint()
    assert _grammar_allows(grammars, tokenizer, constraint, text) is allowed


def test_a_stream_holds_back_a_possible_tag_and_never_reports_whitespace_alone():
    reader = _calling("auto").reader()
    assert [p.content for p in reader.feed("  Hello <tool")] == ["Hello"]
    assert [p.content for p in reader.feed("s are") if p.index < 0] == [" <tools are"]
    assert reader.feed("  \n") == []
    assert reader.finish() == []
    assert "".join(reader.content) == "Hello <tools are"


def test_a_named_function_must_be_one_of_the_tools():
    with pytest.raises(InvalidArgumentError) as error:
        tool_calling(TOOLS, {"type": "function", "function": {"name": "nope"}})
    assert error.value.field == "tool_choice.function.name"
