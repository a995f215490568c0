"""OpenAI's structured outputs as constraints (speculant.constraint): ``response_format``, and
``tools`` with ``tool_choice``, with the text a tool call is generated as and how it is read
back.

Tool calls are generated as text the constraint shapes, in one of three forms (vLLM's):
- a named function (``tool_choice: {"type": "function", "function": {"name": F}}``): the text
  is F's arguments, a JSON object valid against F's ``parameters``;
- ``tool_choice: "required"``: a JSON array of calls ``[{"name": F, "parameters": {...}}, ...]``
  (one at least; one at most without ``parallel_tool_calls``), each valid against its tool;
- ``tool_choice: "auto"``: free text, in which a call is ``<tool_call>{"name": F, "arguments":
  {...}}</tool_call>`` (the Hermes / Qwen form; the arguments are constrained once the tag is
  written). It needs a chat template that shows the model its tools.
``"none"`` constrains nothing. JSON is compact, as every constraint's, except inside auto's
tags, where the model writes the call as it was trained to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from speculant.constraint import Constraint, json_schema_constraint
from speculant.errors import InvalidArgumentError
from speculant.tool_stream import CLOSE_TAG, OPEN_TAG, ToolCall, ToolCallReader

ToolMode = Literal["named", "required", "auto"]
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = OPEN_TAG, CLOSE_TAG
MAX_TOOLS = 128
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def response_format_constraint(response_format: object, field: str = "response_format"):
    """The Constraint of an OpenAI ``response_format`` (None for ``{"type": "text"}``);
    InvalidArgumentError naming the field when it is malformed."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise InvalidArgumentError(field, "must be an object with a 'type'")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind != "json_schema":
        raise InvalidArgumentError(
            f"{field}.type", f"must be 'text', 'json_object' or 'json_schema', got {kind!r}"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(f"{field}.json_schema", "must be an object with a 'schema'")
    schema = spec.get("schema", _ANY_OBJECT)
    if not isinstance(schema, Mapping | bool):
        raise InvalidArgumentError(f"{field}.json_schema.schema", "must be a JSON schema object")
    return json_schema_constraint(schema)


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name and the JSON schema of its arguments."""

    name: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: dict(_ANY_OBJECT))
    description: str = ""

    def as_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's request lists it (what chat templates render)."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolCalling:
    """How a request's tools are called (see the module): the form of the text, the tools
    callable in it, and whether several calls may be made."""

    mode: ToolMode
    tools: tuple[Tool, ...]
    parallel: bool = True

    def constraint(self) -> Constraint:
        """The constraint the generated text keeps to."""
        if self.mode == "named":
            return json_schema_constraint(self.tools[0].parameters)
        if self.mode == "required":
            schema: dict[str, Any] = {
                "type": "array",
                "minItems": 1,
                "items": {"anyOf": [_call_schema(t, "parameters") for t in self.tools]},
            }
            if not self.parallel:
                schema["maxItems"] = 1
            return json_schema_constraint(schema)
        calls = json.dumps({"anyOf": [_call_schema(t, "arguments") for t in self.tools]})
        repeat = "*" if self.parallel else "?"
        grammar = "\n".join(
            [
                f"start: call{repeat} tail",
                "tail: TEXT",
                r"TEXT: /(.|\n)*/",
                f"call_head[lazy]: TEXT {json.dumps(TOOL_CALL_OPEN)}",
                f"call: call_head /\\s*/ %json {calls} /\\s*/ {json.dumps(TOOL_CALL_CLOSE)}",
            ]
        )
        return Constraint("grammar", grammar)

    def reader(self) -> ToolCallReader:
        """A reader of this form's text, delta by delta (speculant.tool_stream)."""
        return ToolCallReader(self.mode, self.tools[0].name if self.mode == "named" else "")

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The generated text as (content, calls): content is the text outside the calls
        (None when there is none); calls are empty when the text makes none (auto) or could not
        be read (a generation cut short by max_tokens: then the text is the content). Read as
        a stream of the text is (speculant.tool_stream), so both answers agree."""
        reader = self.reader()
        reader.feed(text)
        reader.finish()
        if self.mode != "auto" and not reader.complete:
            return text or None, []
        content = "".join(reader.content) + reader.unfinished
        return content.strip() or None, list(reader.calls)


def tool_calling(tools: object, tool_choice: object, parallel: object = True) -> ToolCalling | None:
    """The ToolCalling of an OpenAI request's ``tools``, ``tool_choice`` (default "auto" when
    tools are given) and ``parallel_tool_calls``; None when nothing is constrained (no tools,
    or "none"). InvalidArgumentError naming the field when they are malformed."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise InvalidArgumentError("tool_choice", "needs 'tools'")
        return None
    parsed = parse_tools(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if not isinstance(parallel, bool):
        raise InvalidArgumentError("parallel_tool_calls", "must be true or false")
    if choice == "none":
        return None
    if choice in ("auto", "required"):
        return ToolCalling(choice, parsed, parallel)  # type: ignore[arg-type]
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        named = [t for t in parsed if t.name == name]
        if not named:
            raise InvalidArgumentError(
                "tool_choice.function.name", f"{name!r} is not one of the request's tools"
            )
        return ToolCalling("named", (named[0],), parallel)
    raise InvalidArgumentError(
        "tool_choice",
        "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
    )


def parse_tools(tools: object) -> tuple[Tool, ...]:
    """A request's ``tools`` (OpenAI's function tools), checked."""
    if not isinstance(tools, Sequence) or isinstance(tools, str) or not tools:
        raise InvalidArgumentError("tools", "must be a non-empty list of function tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidArgumentError("tools", f"at most {MAX_TOOLS} tools, got {len(tools)}")
    parsed: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise InvalidArgumentError(f"{where}.type", "must be 'function'")
        function = tool.get("function")
        if not isinstance(function, Mapping):
            raise InvalidArgumentError(f"{where}.function", "must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"{where}.function.name", "must be 1 to 64 letters, digits, '_' or '-'"
            )
        if any(t.name == name for t in parsed):
            raise InvalidArgumentError(f"{where}.function.name", f"{name!r} is given twice")
        parameters = function.get("parameters", _ANY_OBJECT)
        if not isinstance(parameters, Mapping):
            raise InvalidArgumentError(f"{where}.function.parameters", "must be a JSON schema")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise InvalidArgumentError(f"{where}.function.description", "must be a string")
        parsed.append(Tool(name, dict(parameters), description))
    return tuple(parsed)


def _call_schema(tool: Tool, arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of the tool: {"name": its name, arguments_key: its
    arguments}."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, arguments_key: dict(tool.parameters)},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why the grammar engine cannot compile a JSON schema (its reason, e.g. ``Unimplemented
    keys: ["uniqueItems"]``), or None; checked without a tokenizer (well under a millisecond)."""
    import llguidance

    from speculant.grammar import llguidance_grammar, parser_limits

    try:
        grammar = llguidance_grammar(json_schema_constraint(schema))
    except ValueError as exc:
        return str(exc)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, None, limits=parser_limits()
    )
    if not is_error:
        return None
    return " ".join((messages[0] if messages else "the schema does not compile").split())
