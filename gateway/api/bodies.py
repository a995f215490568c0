"""The JSON bodies of the OpenAI routes, as pydantic models: each field's type, bounds and
default, and what a body may not hold; plus the nesting bound every body is held to before it is
parsed (:func:`check_depth`).

:func:`read_body` validates a parsed body against :class:`CompletionBody`, :class:`ChatBody`
or :class:`AddGraphBody` (``POST /admin/graphs``) and turns the first problem into an
InvalidArgumentError naming the field as the client sent it (``prompt[1]``,
``messages[0].tool_calls[0].function.arguments``, ``speculant.graph``). The models check types
strictly (an integer is never a bool or 1.0, a number is finite) and the HTTP door's own bounds
(``n``, ``logprobs``, ``top_logprobs``, prompts per request); the bounds of the records they
fill are checked where those records are declared, when the engine validates a request
(SamplingControls.validate for the sampling controls, whose names and types the body takes from
that class; DraftParams for ``speculant``'s drafting options, read as proto3 JSON of
DraftOptions by gateway.api.requests).

A body's fields are the endpoint's own: any other is an unrecognized argument (400), and so is
an unknown key of ``structured_outputs``; unknown keys of a chat message or of
``stream_options`` are left out, as clients send previous answers back. A null optional field
is an absent one (but ``stream_options.include_usage``, which must be true or false). Options
that would change what is sampled and are not supported (``logit_bias``, ``best_of``,
``echo``, ``suffix``) are accepted only at their default. Fields that take one of several
shapes (``prompt``, ``stop``, a message's ``content``, a JSON schema as an object or as text)
are read by a validator of their own, so that an error names the field, or a position in it,
rather than one of pydantic's union branches.

Depth: Python's json module parses arrays and objects recursively, so a body nested about a
thousand levels deep (``{"prompt": [[[[...]]]]}``) raises RecursionError, and a shallower one
can still raise it later, in code that walks or prints the value. Such a body is refused up
front, naming the field whose value nests too deeply (one pass over strings and brackets).
Real requests nest a few levels (chat messages with content parts: five).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar, get_type_hints

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from speculant.config import MAX_TOP_LOGPROBS, SamplingControls
from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import NO_GRAPH, check_graph_name

MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # choices per request (prompts x n): each is a generation, a gateway slot
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on a completion's `logprobs`
MAX_TOKEN_ID = 2**31 - 1  # an int32 on the wire
MAX_JSON_DEPTH = 64  # arrays and objects inside one another that a request body may have

STRICT = ConfigDict(strict=True, allow_inf_nan=False, frozen=True, extra="forbid")
LENIENT = STRICT | ConfigDict(extra="ignore")  # unknown keys left out
PROBLEMS = {  # pydantic's error types, as the HTTP API words them
    "extra_forbidden": "unrecognized request argument",
    "missing": "is required",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "model_type": "must be an object",
    "list_type": "must be a list",
    "too_short": "must not be empty",
    "string_too_short": "must not be empty",
}


def _strings(value: Any) -> tuple[str, ...] | None:
    """A list of strings, as a tuple (errors name the field itself)."""
    if value is None or (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return None if value is None else tuple(value)
    raise ValueError("must be a list of strings")


def _stop(value: Any) -> tuple[str, ...] | None:
    """A string or a list of strings, as a tuple."""
    if isinstance(value, str):
        return (value,)
    try:
        return _strings(value)
    except ValueError:
        raise ValueError("must be a string or a list of strings") from None


def _json_schema(value: Any) -> Mapping[str, Any] | bool | None:
    """A JSON schema given as an object (or a bool) or as its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
    if value is not None and not isinstance(value, Mapping | bool):
        raise ValueError("must be a JSON schema (an object or its JSON text)")
    return value


def _token_ids(where: str, ids: list[int]) -> tuple[int, ...]:
    for position, token in enumerate(ids):
        if not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidArgumentError(f"{where}[{position}]", f"not a token id: {token}")
    return tuple(ids)


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    """OpenAI's prompt: a string, a list of token ids, a list of strings, or a list of
    token-id lists; as one item (a text or token ids) per prompt."""
    if isinstance(prompt, str):
        return (prompt,)
    if _is_token_ids(prompt):
        return (_token_ids("", prompt),)
    if not isinstance(prompt, list) or not prompt:
        raise ValueError("must be a string, a list of token ids, or a non-empty list of either")
    if len(prompt) > MAX_CHOICES:
        raise ValueError(f"at most {MAX_CHOICES} prompts, got {len(prompt)}")
    out: list[str | tuple[int, ...]] = []
    for i, item in enumerate(prompt):
        if not isinstance(item, str) and not _is_token_ids(item):
            raise InvalidArgumentError(f"[{i}]", "must be a string or a list of token ids")
        out.append(item if isinstance(item, str) else _token_ids(f"[{i}]", item))
    return tuple(out)


def _only(default: object) -> Any:
    """A field accepted only at its default (absent, null or `default`)."""

    def check(value: object) -> object:
        if value is not None and value != default:
            raise ValueError(
                f"only {default!r} is supported (the output must stay exact), got {value!r}"
            )
        return value

    return Annotated[Any, AfterValidator(check)]


Strings = Annotated[Any, AfterValidator(_strings)]
Stop = Annotated[Any, AfterValidator(_stop)]
JsonSchema = Annotated[Any, AfterValidator(_json_schema)]
NoLogitBias, OneOnly, NoEcho, NoSuffix = _only({}), _only(1), _only(False), _only("")


class StreamOptions(BaseModel):
    model_config = LENIENT
    include_usage: bool = False


class SpeculantOptions(BaseModel):
    """The extra object ``speculant``: the graph to draft from and DraftOptions fields (the
    extra keys, read by gateway.api.requests with their proto3 JSON mapping)."""

    model_config = STRICT | ConfigDict(extra="allow")
    graph: str = ""

    @field_validator("graph")
    @classmethod
    def _graph_name(cls, graph: str) -> str:
        return check_graph_name(graph, "") if graph and graph != NO_GRAPH else graph


class StructuredOutputs(BaseModel):
    """vLLM's ``structured_outputs``: one of these keys constrains the output."""

    model_config = STRICT
    json_schema: JsonSchema = Field(None, alias="json")
    regex: str | None = None
    choice: Strings = None
    grammar: str | None = None
    json_object: bool | None = None


def _json_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"must be JSON text: {exc}") from None


class ToolFunction(BaseModel):
    model_config = LENIENT
    name: str
    arguments: Annotated[str, AfterValidator(_json_text)]  # JSON text, read as its value


class ToolCall(BaseModel):
    model_config = LENIENT
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolFunction


class Message(BaseModel):
    """A chat message: a role, content (a string, or OpenAI's list of ``{"type": "text",
    "text"}`` parts, joined; null or absent in an assistant's message that makes tool calls), an
    assistant's ``tool_calls``, a tool message's ``tool_call_id`` (and ``name``)."""

    model_config = LENIENT
    role: Literal["system", "developer", "user", "assistant", "tool"]  # developer: as system
    tool_calls: list[ToolCall] | None = None
    content: Any = Field(None, validate_default=True)
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _role_and_calls(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("role"), str):
            raise InvalidArgumentError("", "must be an object with a string role")
        calls = data.get("tool_calls") not in (None, [])
        if calls and data["role"] in ("system", "developer", "user", "tool"):
            raise InvalidArgumentError("tool_calls", "only an assistant's message has them")
        return data

    @field_validator("content")
    @classmethod
    def _text(cls, content: Any, info: ValidationInfo) -> str | None:
        if content is None and info.data.get("tool_calls"):
            return None
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text"):
                    raise InvalidArgumentError(f"[{j}]", "only parts of type 'text' are supported")
            texts = [part.get("text") for part in content]
            if all(isinstance(t, str) for t in texts):
                return "".join(texts)
        raise ValueError("must be a string or a list of text parts")

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (Hugging Face's convention): tool calls'
        arguments as objects, what templates render with ``tojson``."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in self.tool_calls
            ]
        out["content"] = self.content
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


# SamplingControls' fields, as OpenAI (and vLLM: top_k, min_p, repetition_penalty) name them
SamplingFields = create_model(
    "SamplingFields",
    __config__=STRICT,
    **{name: (hint, None) for name, hint in get_type_hints(SamplingControls).items()},
)


class OpenAIBody(SamplingFields):
    """The fields both OpenAI routes take."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None  # its range is checked by the engine, which names it
    stop: Stop = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    speculant: SpeculantOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    logit_bias: NoLogitBias = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # vLLM's -1 is off, as 0
    response_format: Any = None  # read by speculant.structured
    structured_outputs: StructuredOutputs | None = None
    guided_json: JsonSchema = None
    guided_regex: str | None = None
    guided_choice: Strings = None
    guided_grammar: str | None = None

    def sampling(self) -> SamplingControls:
        """The sampling controls given (their ranges are checked by the engine)."""
        given = {name: getattr(self, name) for name in SamplingFields.model_fields}
        return SamplingControls(**given | {"top_k": 0 if self.top_k == -1 else self.top_k})


class CompletionBody(OpenAIBody):
    """``POST /v1/completions``."""

    prompt: Annotated[Any, AfterValidator(_prompts)]
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    best_of: OneOnly = None
    echo: NoEcho = None
    suffix: NoSuffix = None


class ChatBody(OpenAIBody):
    """``POST /v1/chat/completions``: tools and their choice are read by speculant.structured."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None


class AddGraphBody(BaseModel):
    """``POST /admin/graphs``: serve the graph folder `path` under `name`."""

    model_config = STRICT
    name: Annotated[str, Field(min_length=1)]
    path: Annotated[str, Field(min_length=1)]


Body = TypeVar("Body", bound=BaseModel)


def read_body(model: type[Body], body: Any) -> Body:
    """body (parsed JSON) as `model`; InvalidArgumentError naming the first bad field (an
    unrecognized one first)."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("request", "the body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
        raise _invalid(errors[0]) from None


def _invalid(error: ErrorDetails) -> InvalidArgumentError:
    """A pydantic error as InvalidArgumentError: its location as a field path, a problem
    raised as InvalidArgumentError naming a place inside it (``[1]``, ``tool_calls``)."""
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidArgumentError):
        inside = cause.field
        if inside and path:
            path += inside if inside.startswith("[") else f".{inside}"
        return InvalidArgumentError(path or inside, cause.problem)
    kind = error["type"]
    if kind in PROBLEMS:
        problem = PROBLEMS[kind]
        if kind.endswith("_type"):
            problem += f", got {type(error['input']).__name__}"
    else:  # a bound, a literal, a validator's ValueError
        problem = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        if kind in ("greater_than_equal", "less_than_equal", "literal_error"):
            problem += f", got {error['input']!r}"
    return InvalidArgumentError(path or "request", problem)


# A JSON string (its escapes included) or one bracket: the only tokens that matter for depth.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class TooDeep(ValueError):
    """The body nests more than MAX_JSON_DEPTH levels; field: the top-level key whose value does
    ("" when the body is not an object)."""

    def __init__(self, field: str, limit: int) -> None:
        where = f"{field}: " if field else ""
        super().__init__(f"{where}arrays and objects nested more than {limit} levels deep")
        self.field = field


def check_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise TooDeep if `data` (a JSON text, not yet parsed) nests deeper than `limit`.

    One regular-expression pass over strings and brackets; malformed JSON is left to the parser.
    The field named is the last string read at the top level before the value that went too
    deep opened: in an object, that value's key.
    """
    depth = 0
    in_object = False  # the body is an object (its top-level strings are keys and values)
    key = ""  # the last top-level string: the key of the value that follows it
    field = ""  # the top-level key of the value being read
    for token in _TOKENS.finditer(data):
        text = token.group()
        if text in (b"[", b"{"):
            depth += 1
            if depth == 1:
                in_object = text == b"{"
            elif depth == 2:
                field = key if in_object else ""
            if depth > limit:
                raise TooDeep(field, limit)
        elif text in (b"]", b"}"):
            depth -= 1
        elif depth == 1:
            key = text[1:-1].decode("utf-8", "replace")
