"""The HTTP API's request bodies as pydantic models (gateway.api.bodies): errors name the field
as the client sent it, down to a position inside it; the sampling controls are
SamplingControls' own fields; null is absent. No servers."""

from __future__ import annotations

import json

import pytest

from gateway.api.bodies import AddGraphBody, read_body
from gateway.api.requests import parse_openai_request
from speculant.config import SamplingControls
from speculant.errors import InvalidArgumentError

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("chat", "body", "param"),
    [
        (False, {"prompt": [[1], [2, -3]]}, "prompt[1][1]"),
        (False, {"prompt": [1, 2**31]}, "prompt[1]"),
        (False, {"prompt": [True]}, "prompt[0]"),
        (
            False,
            {"prompt": "a", "stream_options": {"include_usage": None}},
            "stream_options.include_usage",
        ),
        (False, {"prompt": "a", "guided_choice": ["a", 1]}, "guided_choice"),
        (False, {"prompt": 5, "frobnicate": 1}, "frobnicate"),  # an unknown field first
        (False, json.loads('{"prompt": "a", "temperature": 1e999}'), "temperature"),
        (True, {"messages": [USER, "hi"]}, "messages[1]"),
        (True, {"messages": [{"role": 5, "content": "hi"}]}, "messages[0]"),
        (True, {"messages": [USER, {"role": "robot", "tool_calls": [{}]}]}, "messages[1].role"),
        (True, {"messages": [{"role": "tool", "content": "a", "name": 5}]}, "messages[0].name"),
        (True, {"messages": [USER], "prompt": "a"}, "prompt"),
        (True, {"messages": [USER], "speculant": {"graph": "a.b"}}, "speculant.graph"),
    ],
)
def test_errors_name_the_field_as_sent(chat, body, param):
    with pytest.raises(InvalidArgumentError) as error:
        parse_openai_request(body, chat=chat)
    assert error.value.field == param


def test_the_sampling_controls_are_read_as_samplingcontrols():
    # that the body's sampling fields are SamplingControls': tests/test_draft_params_source.py
    read = parse_openai_request({"prompt": "a", "top_k": -1, "top_p": None}, chat=False)
    assert read.generates[0].sampling == SamplingControls(top_k=0)  # -1 is off, as 0
    zero = parse_openai_request({"prompt": "a", "top_k": 0}, chat=False)
    assert zero.generates[0].sampling.top_k == 0  # off, not the model's default


def test_the_admin_body_takes_a_name_and_a_path():
    assert read_body(AddGraphBody, {"name": "g", "path": "/p"}) == AddGraphBody(name="g", path="/p")
    for body, param in (({"name": "", "path": "/p"}, "name"), ({"name": "g"}, "path")):
        with pytest.raises(InvalidArgumentError) as error:
            read_body(AddGraphBody, body)
        assert error.value.field == param
