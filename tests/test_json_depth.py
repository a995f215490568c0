"""gateway.api.bodies.check_depth: a JSON body's nesting is measured before it is parsed, and
the field whose value nests too deeply is named (strings, brackets inside them and escapes
included)."""

from __future__ import annotations

import json

import pytest

from gateway.api.bodies import MAX_JSON_DEPTH, TooDeep, check_depth


def nested(levels: int) -> str:
    return "[" * levels + "1" + "]" * levels


def test_a_body_at_the_limit_passes_and_one_level_more_names_its_field() -> None:
    # the body's own object is one level: its value may nest MAX_JSON_DEPTH - 1 more
    check_depth(f'{{"prompt": {nested(MAX_JSON_DEPTH - 1)}}}'.encode())
    with pytest.raises(TooDeep) as excinfo:
        check_depth(f'{{"model": "m", "prompt": {nested(MAX_JSON_DEPTH)}}}'.encode())
    assert excinfo.value.field == "prompt"
    assert "prompt" in str(excinfo.value) and str(MAX_JSON_DEPTH) in str(excinfo.value)


def test_the_field_is_the_key_of_the_deep_value_not_an_earlier_one() -> None:
    body = {"a": "x", "messages": [{"role": "user", "content": "[[[{{{"}], "b": {"c": [1]}}
    check_depth(json.dumps(body).encode(), limit=3)
    deep = json.dumps({"a": "[[[", "b": 'q\\"}', "messages": [[[[1]]]]}).encode()
    with pytest.raises(TooDeep) as excinfo:
        check_depth(deep, limit=4)
    assert excinfo.value.field == "messages"


def test_a_top_level_array_names_no_field() -> None:
    with pytest.raises(TooDeep) as excinfo:
        check_depth(f'["prompt", {nested(10)}]'.encode(), limit=5)
    assert excinfo.value.field == ""


def test_malformed_json_is_left_to_the_parser() -> None:
    for body in (b"", b'{"prompt": "Once', b"]]]]", b'{"a": [1}'):
        check_depth(body)  # no error here: json.loads says what is wrong


def test_a_body_the_parser_cannot_take_is_refused_first() -> None:
    body = f'{{"prompt": {nested(5000)}}}'.encode()
    with pytest.raises(RecursionError):
        json.loads(body)
    with pytest.raises(TooDeep):
        check_depth(body)
