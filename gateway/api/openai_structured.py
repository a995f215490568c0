"""What an OpenAI request's output must match, read from OpenAI's and vLLM's fields: the
constraint (speculant.constraint), the client field that gave it (errors name it), and for a
chat request its tools (shown to the model by the chat template) and how they are called
(speculant.structured).

The fields, of which at most one may constrain a request (400 naming the two otherwise):
- ``response_format``: OpenAI's ``{"type": "text" | "json_object" | "json_schema",
  "json_schema": {"name", "schema", "strict"}}`` (``text`` constrains nothing);
- ``structured_outputs``: vLLM's object with one of ``json`` (a schema, as an object or as JSON
  text), ``regex``, ``choice`` (strings), ``grammar`` (Lark or GBNF) and ``json_object: true``;
- ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``: vLLM's older fields;
- chat only: ``tools`` with ``tool_choice`` (``none``, ``auto``, ``required`` or a named
  function) and ``parallel_tool_calls``; ``none`` constrains nothing and shows the model no
  tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from speculant.constraint import Constraint, json_schema_constraint
from speculant.errors import InvalidArgumentError
from speculant.structured import ToolCalling, response_format_constraint, tool_calling

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")
STRUCTURED_FIELDS = ("response_format", "structured_outputs", *GUIDED_FIELDS)
_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutput:
    """A request's constraint (None: free text) and the client field that set it; with tools,
    how they are called and the tools as the chat template takes them."""

    constraint: Constraint | None = None
    field: str = ""
    tool_calling: ToolCalling | None = None
    tools: tuple[dict[str, Any], ...] = ()  # for the chat template (empty: none shown)


def structured_output(body: Mapping[str, Any], *, chat: bool) -> StructuredOutput:
    """The request's StructuredOutput; InvalidArgumentError naming the client's field when a
    field is malformed or more than one constrains the output."""
    given: list[tuple[str, Constraint | None]] = [
        ("response_format", response_format_constraint(body.get("response_format"))),
        *_structured_outputs(body.get("structured_outputs")),
        *((name, _guided(name, body.get(name))) for name in GUIDED_FIELDS),
    ]
    calling = tools = None
    if chat:
        calling = tool_calling(
            body.get("tools"),
            body.get("tool_choice"),
            True if body.get("parallel_tool_calls") is None else body["parallel_tool_calls"],
        )
        if calling is not None:
            tools = [tool.as_openai() for tool in calling.tools]
            if calling.mode != "named":
                check_tool_schemas(calling)
            given.append((_tools_field(body, calling), calling.constraint()))
    constraints = [(name, c) for name, c in given if c is not None]
    if len(constraints) > 1:
        names = " and ".join(repr(name.split(".")[0]) for name, _ in constraints[:2])
        raise InvalidArgumentError(
            constraints[1][0].split("[")[0].split(".")[0],
            f"{names} both constrain the output; give one of them",
        )
    if not constraints:
        return StructuredOutput()
    field, constraint = constraints[0]
    return StructuredOutput(constraint, field, calling, tuple(tools or ()))


def _structured_outputs(value: object) -> list[tuple[str, Constraint | None]]:
    """vLLM's ``structured_outputs`` object, as (field, constraint) pairs (nulls skipped)."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise InvalidArgumentError("structured_outputs", "must be an object")
    for key in value:
        if key not in _STRUCTURED_KEYS:
            raise InvalidArgumentError(
                f"structured_outputs.{key}",
                f"unrecognized; give one of {', '.join(_STRUCTURED_KEYS)}",
            )
    pairs = []
    for key in _STRUCTURED_KEYS:
        item = value.get(key)
        if item is None:
            continue
        name = f"structured_outputs.{key}"
        if key == "json_object":
            if not isinstance(item, bool):
                raise InvalidArgumentError(name, "must be true or false")
            pairs.append((name, Constraint("json_object") if item else None))
        else:
            pairs.append((name, _guided(f"guided_{key}", item, name)))
    return pairs


def _guided(kind: str, value: object, name: str | None = None) -> Constraint | None:
    """The constraint of a guided_* field (or of the structured_outputs key `name`)."""
    name = name or kind
    if value is None:
        return None
    if kind == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidArgumentError(name, f"not valid JSON: {exc}") from exc
        if not isinstance(value, Mapping | bool):
            raise InvalidArgumentError(name, "must be a JSON schema (an object or its JSON text)")
        return json_schema_constraint(value)
    if kind == "guided_choice":
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise InvalidArgumentError(name, "must be a list of strings")
        return Constraint("choice", choices=tuple(value))
    if not isinstance(value, str):
        raise InvalidArgumentError(name, "must be a string")
    return Constraint("regex" if kind == "guided_regex" else "grammar", value)


def _tools_field(body: Mapping[str, Any], calling: ToolCalling) -> str:
    """The client field a tools constraint's compile errors name: the named tool's
    parameters, the one tool's, or ``tools``."""
    tools = body.get("tools") or []
    if calling.mode == "named":
        name = calling.tools[0].name
        index = next(i for i, t in enumerate(tools) if t["function"]["name"] == name)
        return f"tools[{index}].function.parameters"
    return "tools[0].function.parameters" if len(tools) == 1 else "tools"


def check_tool_schemas(calling: ToolCalling) -> None:
    """InvalidArgumentError naming ``tools[i].function.parameters`` with the grammar engine's
    reason when a tool's schema cannot be compiled (checked one by one, so that the error names
    the tool; a named function's schema is the constraint itself, compiled by the engine)."""
    from speculant.structured import schema_problem

    for index, tool in enumerate(calling.tools):
        problem = schema_problem(tool.parameters)
        if problem:
            raise InvalidArgumentError(f"tools[{index}].function.parameters", problem)
