"""The HTTP API's request bodies as the library's PromptRequests, which the engine runs exactly
as it runs the gRPC door's (gateway.engine: the same defaults, validation, limits and errors).

- ``POST /generate``: a GenerateRequest as JSON (the proto3 JSON mapping, as grpcurl takes it;
  ``draft.strategy`` may also be ``"greedy"`` / ``"sampling"``), read as the gRPC door reads
  the message (gateway.api.server.prompt_request_from_pb);
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's bodies
  (gateway.api.bodies), one PromptRequest per *choice*: ``n`` choices per prompt each get their
  own seed (:func:`choice_seed`); a completion's several prompts give prompts x n choices,
  indexed ``prompt_index * n + j`` as OpenAI does. The sampling controls go to
  ``GenerateRequest.sampling``, ``logprobs`` / ``top_logprobs`` to ``top_logprobs``; the
  object ``speculant`` carries draft options (the DraftOptions fields, read with their proto3
  JSON mapping) and ``graph``, the graph to draft from (as a model id ``<model>:<graph>`` does,
  the way vLLM names LoRA adapters: :meth:`ApiRequest.with_graph`).

What the output must match is read from OpenAI's and vLLM's fields (:func:`structured_output`),
of which at most one may constrain a request (400 naming the two otherwise):
``response_format`` (OpenAI's; ``text`` constrains nothing), ``structured_outputs`` (vLLM's:
one of ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``), vLLM's older
``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar``, and for chat
``tools`` with ``tool_choice`` (``none``, ``auto``, ``required`` or a named function) and
``parallel_tool_calls`` (speculant.structured; ``none`` shows the model no tools).

Errors name the field as the client sent it (:meth:`ApiRequest.client_field`: the engine's
``draft.k`` is ``speculant.k``, its ``constraint`` the field that gave the constraint).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf import json_format

from gateway.api.bodies import (
    MAX_CHOICES,
    ChatBody,
    CompletionBody,
    OpenAIBody,
    StructuredOutputs,
    read_body,
)
from gateway.generation import PromptRequest
from speculant.constraint import Constraint, json_schema_constraint
from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import NO_GRAPH, check_graph_name
from speculant.structured import (
    ToolCalling,
    response_format_constraint,
    schema_problem,
    tool_calling,
)
from speculant.v1 import common_pb2, gateway_pb2
from speculant.wire import STRATEGY_TO_PROTO, draft_fields_from_pb

_STRATEGY_NAMES = {  # "greedy" -> "DRAFT_STRATEGY_GREEDY" (the JSON form of the enum)
    name: common_pb2.DraftStrategy.Name(value) for name, value in STRATEGY_TO_PROTO.items()
}
GUIDED_KINDS = ("json", "regex", "choice", "grammar")  # guided_<kind>, structured_outputs.<kind>


@dataclass(frozen=True)
class StructuredOutput:
    """A request's constraint (None: free text) and the client field that set it; with tools,
    how they are called and the tools as the chat template takes them."""

    constraint: Constraint | None = None
    field: str = ""
    tool_calling: ToolCalling | None = None
    tools: tuple[dict[str, Any], ...] = ()  # for the chat template (empty: none shown)


@dataclass(frozen=True)
class ApiRequest:
    """An OpenAI request translated: one PromptRequest per choice, and how to answer."""

    generates: tuple[PromptRequest, ...]  # [choice index]
    chat: bool  # a chat completion (message / delta) rather than a text completion
    stream: bool  # answer with server-sent events
    include_usage: bool  # stream_options.include_usage: a last chunk with usage
    n: int = 1  # choices per prompt (choice i answers prompt i // n)
    max_tokens_field: str = "max_tokens"  # or max_completion_tokens, as the client sent it
    structured: StructuredOutput = field(default_factory=StructuredOutput)  # constraint, tools
    model: str = ""  # the model id as the client sent it ("<model>:<graph>" names a graph)
    graph: str = ""  # speculant.graph, as the client sent it

    def with_graph(self, served_model: str, tenant: str) -> ApiRequest:
        """The request's generations drafting from the graph it names (its model id
        ``<model>:<graph>`` unless it is the served model's own name, or speculant.graph;
        InvalidArgumentError when the two differ), for the caller's tenant."""
        graph = self.graph
        if self.model and self.model != served_model and ":" in self.model:
            named = self.model.rpartition(":")[2]
            if named != NO_GRAPH:
                check_graph_name(named, "model")
            if graph and graph != named:
                raise InvalidArgumentError(
                    "speculant.graph", f"{graph!r} is not the graph the model id names ({named!r})"
                )
            graph = named
        generates = tuple(replace(g, graph=graph, tenant=tenant) for g in self.generates)
        return replace(self, generates=generates)

    @property
    def logprobs(self) -> bool:
        """Whether the answer reports log-probabilities."""
        return self.generates[0].top_logprobs is not None

    def client_field(self, field: str) -> str:
        """A request field path (as the engine names it) as this client named it."""
        if field == "max_tokens":
            return self.max_tokens_field
        if field == "top_logprobs" and not self.chat:
            return "logprobs"
        if field.startswith("prompt"):  # prompt, prompt_token_ids, prompt_token_ids[3]
            return "messages" if self.chat else "prompt"
        if field.split(".")[0] == "constraint" and self.structured.field:
            return self.structured.field  # response_format, guided_regex, tools, ...
        return api_field(field)


def api_field(field: str) -> str:
    """A request field path as the HTTP client named it (``draft.k`` -> ``speculant.k``,
    ``sampling.top_p`` -> ``top_p``)."""
    if field == "draft" or field.startswith("draft."):
        return "speculant" + field.removeprefix("draft")
    return field.removeprefix("sampling.")


def renamed(exc: InvalidArgumentError, field: str) -> InvalidArgumentError:
    """The same error, naming the field as the client did."""
    return InvalidArgumentError(field, exc.problem)


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` (0..n-1) of a request seeded with `seed`: choice 0 keeps the
    request's seed (so n=1 answers as before), choice i > 0 takes the first 8 bytes (big
    endian) of BLAKE2b("seed:i"), a uint64 unrelated to the seeds of the other choices."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _choice_seed_of(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a prompt. Unseeded, choice 0 takes the gateway's default
    (random unless one is configured) and the others a random seed each, so that no gateway
    default makes the choices identical. A seed out of range is kept: the engine refuses it,
    naming the field."""
    if seed is None:
        return secrets.randbits(64) if index > 0 else None
    if index == 0 or not 0 <= seed < 2**64:
        return seed
    return choice_seed(seed, index)


def _strategy_named(draft: dict[str, Any]) -> dict[str, Any]:
    """DraftOptions JSON whose strategy may be a short name ("greedy")."""
    if draft.get("strategy") in _STRATEGY_NAMES:
        return {**draft, "strategy": _STRATEGY_NAMES[draft["strategy"]]}
    return draft


def _parse_proto(body: dict[str, Any], message: Any, prefix: str = "") -> Any:
    """body (proto3 JSON of the message) parsed into `message`; InvalidArgumentError naming
    the field (under `prefix`) if it does not parse."""
    try:
        return json_format.ParseDict(body, message)
    except json_format.ParseError as exc:
        text = str(exc).splitlines()[0]
        names = re.findall(r"Failed to parse (\w+) field", text)
        unknown = re.search(r'has no field named "(\w+)"', text)
        if unknown:
            names.append(unknown.group(1))
        elif not names:
            at = re.search(r" at [A-Za-z]+\.([\w.]+)", text)
            names = at.group(1).split(".") if at else []
        field = ".".join(names)
        raise InvalidArgumentError(
            f"{prefix}{field}" if field else prefix.rstrip(".") or "request", text
        ) from exc


def parse_generate_request(body: Any) -> gateway_pb2.GenerateRequest:
    """The body of ``POST /generate``: a GenerateRequest in the proto3 JSON mapping."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("request", "the body must be a JSON object")
    draft = body.get("draft")
    if isinstance(draft, dict):
        body = {**body, "draft": _strategy_named(draft)}
    return _parse_proto(body, gateway_pb2.GenerateRequest())


def _draft_fields(options: dict[str, Any] | None) -> dict[str, object]:
    """``speculant``'s DraftOptions fields as the drafting fields they set."""
    if not options:
        return {}
    try:
        parsed = _parse_proto(_strategy_named(options), common_pb2.DraftOptions(), "draft.")
        return draft_fields_from_pb(parsed)
    except InvalidArgumentError as exc:
        raise renamed(exc, api_field(exc.field)) from exc


def parse_openai_request(body: Any, *, chat: bool) -> ApiRequest:
    """The body of ``POST /v1/completions`` (chat=False) or ``/v1/chat/completions``."""
    read: OpenAIBody = read_body(ChatBody if chat else CompletionBody, body)
    if isinstance(read, ChatBody):
        prompts = [PromptRequest(messages=tuple(m.for_template() for m in read.messages))]
        newer = read.max_completion_tokens is not None
        max_tokens = read.max_completion_tokens if newer else read.max_tokens
        limit_field = "max_completion_tokens" if newer else "max_tokens"
    else:
        assert isinstance(read, CompletionBody)
        prompts = [
            PromptRequest(prompt=p) if isinstance(p, str) else PromptRequest(prompt_token_ids=p)
            for p in read.prompt
        ]
        max_tokens, limit_field = read.max_tokens, "max_tokens"
    n = read.n or 1
    if n * len(prompts) > MAX_CHOICES:
        raise InvalidArgumentError(
            "n", f"{len(prompts)} prompts x n={n} choices is over the limit of {MAX_CHOICES}"
        )
    structured = structured_output(read)
    stream = bool(read.stream)
    usage = stream and bool(read.stream_options and read.stream_options.include_usage)
    extension = read.speculant
    graph = extension.graph if extension else ""
    options = extension.model_extra if extension else None
    calling = structured.tool_calling
    shared = replace(
        prompts[0],
        max_tokens=max_tokens,
        temperature=read.temperature,
        stop=read.stop or (),
        draft=_draft_fields(options),
        sampling=read.sampling(),
        top_logprobs=_top_logprobs(read),
        constraint=structured.constraint,
        tools=structured.tools,
        tools_must_show=calling is not None and calling.mode == "auto",
    )
    generates = tuple(
        replace(
            shared,
            prompt=prompt.prompt,
            prompt_token_ids=prompt.prompt_token_ids,
            seed=_choice_seed_of(read.seed, j),
        )
        for prompt in prompts
        for j in range(n)
    )
    model = read.model or ""
    return ApiRequest(generates, chat, stream, usage, n, limit_field, structured, model, graph)


def _top_logprobs(read: OpenAIBody) -> int | None:
    """The alternatives per token to report (None: no log-probabilities). Completions:
    ``logprobs`` (an integer); chat: ``logprobs: true`` and ``top_logprobs``."""
    if not isinstance(read, ChatBody):
        return read.logprobs
    if read.top_logprobs and not read.logprobs:
        raise InvalidArgumentError("top_logprobs", "needs logprobs: true")
    return (read.top_logprobs or 0) if read.logprobs else None


def structured_output(read: OpenAIBody) -> StructuredOutput:
    """The request's StructuredOutput; InvalidArgumentError naming the client's field when a
    field is malformed or more than one constrains the output."""
    given: list[tuple[str, Constraint | None]] = [
        ("response_format", response_format_constraint(read.response_format)),
        *_structured_outputs(read.structured_outputs),
        *(
            (f"guided_{kind}", _guided(kind, getattr(read, f"guided_{kind}")))
            for kind in GUIDED_KINDS
        ),
    ]
    calling = None
    if isinstance(read, ChatBody):
        parallel = read.parallel_tool_calls
        calling = tool_calling(read.tools, read.tool_choice, True if parallel is None else parallel)
        if calling is not None:
            if calling.mode != "named":
                check_tool_schemas(calling)
            given.append((_tools_field(read.tools, calling), calling.constraint()))
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
    tools = tuple(tool.as_openai() for tool in calling.tools) if calling else ()
    return StructuredOutput(constraint, field, calling, tools)


def _structured_outputs(value: StructuredOutputs | None) -> list[tuple[str, Constraint | None]]:
    """vLLM's ``structured_outputs`` object, as (field, constraint) pairs."""
    if value is None:
        return []
    given = {"json": value.json_schema, "regex": value.regex, "choice": value.choice}
    pairs = [
        (f"structured_outputs.{kind}", _guided(kind, v))
        for kind, v in (given | {"grammar": value.grammar}).items()
    ]
    json_object = Constraint("json_object") if value.json_object else None
    return [*pairs, ("structured_outputs.json_object", json_object)]


def _guided(kind: str, value: Any) -> Constraint | None:
    """The constraint of a guided_<kind> field (or of the structured_outputs key)."""
    if value is None:
        return None
    if kind == "json":
        return json_schema_constraint(value)
    if kind == "choice":
        return Constraint("choice", choices=tuple(value))
    return Constraint(kind, value)


def _tools_field(tools: Any, calling: ToolCalling) -> str:
    """The client field a tools constraint's compile errors name: the named tool's
    parameters, the one tool's, or ``tools``."""
    if calling.mode == "named":
        name = calling.tools[0].name
        index = next(i for i, t in enumerate(tools) if t["function"]["name"] == name)
        return f"tools[{index}].function.parameters"
    return "tools[0].function.parameters" if len(tools) == 1 else "tools"


def check_tool_schemas(calling: ToolCalling) -> None:
    """InvalidArgumentError naming ``tools[i].function.parameters`` with the grammar engine's
    reason when a tool's schema cannot be compiled (checked one by one, so that the error names
    the tool; a named function's schema is the constraint itself, compiled by the engine)."""
    for index, tool in enumerate(calling.tools):
        problem = schema_problem(tool.parameters)
        if problem:
            raise InvalidArgumentError(f"tools[{index}].function.parameters", problem)
