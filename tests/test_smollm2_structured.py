"""Structured outputs and tools with a real instruct model (../shared/models/smollm2-135m-instruct)
over the three services and the HTTP API, through the official OpenAI client:
``chat.completions.parse(response_format=<a Pydantic model>)`` returns the parsed object, and a
dev prompt's ``tools`` with ``tool_choice="required"`` answer calls whose arguments validate
against the tool's schema. SmolLM2 is slow on a CPU: two short requests."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from speculant.config import VerifierConfig
from tests.assets import PYTHON_CORPUS, SMOLLM2_MODEL, needs
from tests.structured_http import http_apis

JSON_PROMPTS = PYTHON_CORPUS / "dev_json_prompts.jsonl"
pytestmark = needs(SMOLLM2_MODEL, PYTHON_CORPUS / "docs.rst.txt", JSON_PROMPTS)

CORPUS_BYTES = 400_000  # a slice of docs.rst.txt: a graph in a few seconds


class Capital(BaseModel):
    country: str = Field(max_length=40)
    capital: str = Field(max_length=40)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from builder import GraphBuilder

    corpus = tmp_path_factory.mktemp("docs") / "docs.rst.txt"
    with (PYTHON_CORPUS / "docs.rst.txt").open(encoding="utf-8") as f:
        corpus.write_text(f.read(CORPUS_BYTES), encoding="utf-8")
    graph = tmp_path_factory.mktemp("graph") / "docs"
    builder = GraphBuilder(tokenizer_name=str(SMOLLM2_MODEL), max_order=5, progress=False)
    builder.build_from_files([str(corpus)])
    builder.save(graph)
    verifier = VerifierConfig(model_name=str(SMOLLM2_MODEL), device="cpu")
    with http_apis(graph, verifier, [{}]) as apis:
        yield apis[0]


def test_parse_with_a_pydantic_model_returns_the_parsed_object(api):
    completion = api.client.chat.completions.parse(
        model="model",
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format=Capital,
        max_tokens=60,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Capital)
    assert choice.message.parsed == Capital.model_validate_json(choice.message.content)


def _first_tool_prompt() -> dict:
    with JSON_PROMPTS.open(encoding="utf-8") as f:
        return next(row for line in f if (row := json.loads(line))["kind"] == "tool")


def test_required_tools_answer_calls_valid_against_the_tools_schema(api):
    row = _first_tool_prompt()
    answer = api.client.chat.completions.create(
        model="model",
        messages=row["messages"],
        tools=row["tools"],
        tool_choice=row["tool_choice"],
        max_tokens=160,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    # the dev tools' schemas use type (string, integer), maxLength, enum, minimum and maximum
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in row["tools"]}
    for call in choice.message.tool_calls:
        arguments = json.loads(call.function.arguments)
        schema = schemas[call.function.name]
        assert set(arguments) == set(schema["required"]) <= set(schema["properties"])
        for key, value in arguments.items():
            spec = schema["properties"][key]
            assert {"string": str, "integer": int}[spec["type"]] is type(value)
            if "maxLength" in spec:
                assert len(value) <= spec["maxLength"]
            if "enum" in spec:
                assert value in spec["enum"]
            if "maximum" in spec:
                assert spec["minimum"] <= value <= spec["maximum"]
