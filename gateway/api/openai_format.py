"""JSON bodies of the HTTP API -> the library's PromptRequests.

Three request shapes are translated into :class:`~gateway.generation.PromptRequest`s, which the
engine runs exactly as it runs the gRPC door's (gateway.engine: the same defaults, validation,
limits and errors):
- ``POST /generate``: a GenerateRequest as JSON (the proto3 JSON mapping, as grpcurl takes it;
  ``draft.strategy`` may also be ``"greedy"`` / ``"sampling"``), read as the gRPC door reads
  the message (gateway.api.server.prompt_request_from_pb);
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request bodies, one
  PromptRequest per *choice*. The sampling controls (``top_k``, ``top_p``, ``min_p``,
  ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``) go to
  ``GenerateRequest.sampling``, ``logprobs`` / ``top_logprobs`` to ``top_logprobs``; ``n``
  choices per prompt each get their own seed (:func:`choice_seed`); a completion's ``prompt``
  may be a string, a list of token ids, or a list of either (choices = prompts x n, indexed
  ``prompt_index * n + j`` as OpenAI does). Fields that would change what is sampled and are
  not supported (``logit_bias``, ``best_of`` > 1, ``echo``, ``suffix``) are refused with a 400
  naming the field, never ignored. The non-standard object ``speculant`` carries draft options
  (``{"k": 8, "strategy": "greedy", ...}``, the DraftOptions fields, read with their proto3
  JSON mapping), and ``graph``, the graph to draft from (as a model id ``<model>:<graph>``
  does, the way vLLM names LoRA adapters: :meth:`ApiRequest.with_graph`). What the output must
  match (``response_format``, vLLM's ``structured_outputs`` and ``guided_*``; chat's ``tools``
  and ``tool_choice``) is read by gateway.api.openai_structured, chat messages by
  gateway.api.openai_messages.

The answers' shapes are built by gateway.api.http_answers.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf import json_format

from gateway.api.openai_fields import (
    check_range,
    check_type,
    is_token_ids,
    stop_strings,
    token_ids,
)
from gateway.api.openai_messages import chat_messages
from gateway.api.openai_structured import (
    STRUCTURED_FIELDS,
    TOOL_FIELDS,
    StructuredOutput,
    structured_output,
)
from gateway.generation import PromptRequest
from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import NO_GRAPH, check_graph_name
from speculant.sampling_controls import SamplingControls
from speculant.strategies import STRATEGY_TO_PROTO
from speculant.v1 import common_pb2, gateway_pb2
from speculant.wire import draft_fields_from_pb

_STRATEGY_NAMES = {  # "greedy" -> "DRAFT_STRATEGY_GREEDY" (the JSON form of the enum)
    name: common_pb2.DraftStrategy.Name(value) for name, value in STRATEGY_TO_PROTO.items()
}

MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # choices per request (prompts x n): each is a generation, a gateway slot
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on a completion's `logprobs`
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on a chat completion's `top_logprobs`

# The sampling controls of SamplingControls, as OpenAI (and vLLM, for top_k, min_p and
# repetition_penalty) name them in a request; top_k is an integer, the others numbers.
SAMPLING_FIELDS = (
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)

# Accepted fields of each endpoint. Unsupported OpenAI options are accepted only at their
# default ("must be absent, null or this"); any other field is an unrecognized argument.
_COMMON_FIELDS = {
    "model",
    "max_tokens",
    "temperature",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "speculant",
    "n",
    "logit_bias",
    "logprobs",
    *SAMPLING_FIELDS,
    *STRUCTURED_FIELDS,
}
_ONLY_DEFAULT: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
}
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix"}
_CHAT_FIELDS = _COMMON_FIELDS | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    *TOOL_FIELDS,
}


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


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` (0..n-1) of a request seeded with `seed`: choice 0 keeps the
    request's seed (so n=1 answers as before), choice i > 0 takes the first 8 bytes (big
    endian) of BLAKE2b("seed:i"), a uint64 unrelated to the seeds of the other choices."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _parse_error_field(message: str) -> str | None:
    """The field path a json_format.ParseError message names, if any."""
    names = re.findall(r"Failed to parse (\w+) field", message)
    unknown = re.search(r'has no field named "(\w+)"', message)
    if unknown:
        names.append(unknown.group(1))
    elif not names:
        at = re.search(r" at [A-Za-z]+\.([\w.]+)", message)
        names = at.group(1).split(".") if at else []
    return ".".join(names) or None


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
        field = _parse_error_field(text)
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


def _draft_fields(draft: dict[str, Any] | None) -> dict[str, object]:
    """The ``speculant`` object (DraftOptions fields, and ``graph``) as the drafting fields it
    sets."""
    if draft is None:
        return {}
    draft = {name: value for name, value in draft.items() if name != "graph"}
    options = _parse_proto(_strategy_named(draft), common_pb2.DraftOptions(), "draft.")
    return draft_fields_from_pb(options)


def _graph_field(extension: dict[str, Any] | None) -> str:
    """``speculant.graph``: the graph to draft from ("" when not given), checked."""
    graph = (extension or {}).get("graph", "")
    if not isinstance(graph, str):
        raise InvalidArgumentError("speculant.graph", "must be a string")
    if graph and graph != NO_GRAPH:
        check_graph_name(graph, "speculant.graph")
    return graph


def _check_only_defaults(body: dict[str, Any], names: set[str]) -> None:
    for name in sorted(names):
        value = body.get(name)
        if value is not None and value not in _ONLY_DEFAULT[name]:
            default = _ONLY_DEFAULT[name][0]
            raise InvalidArgumentError(
                name, f"only {default!r} is supported (the output must stay exact), got {value!r}"
            )


def _prompts(body: dict[str, Any]) -> list[PromptRequest]:
    """A completion's prompts, each as a PromptRequest of a text or of token ids. OpenAI's
    prompt is a string, a list of token ids, a list of strings, or a list of token-id lists."""
    prompt = body.get("prompt")
    what = "a string, a list of token ids, or a non-empty list of either"
    if isinstance(prompt, str):
        return [PromptRequest(prompt=prompt)]
    if is_token_ids(prompt):
        return [PromptRequest(prompt_token_ids=token_ids("prompt", prompt))]
    if not isinstance(prompt, list) or not prompt:
        raise InvalidArgumentError("prompt", f"must be {what}")
    if len(prompt) > MAX_CHOICES:
        raise InvalidArgumentError("prompt", f"at most {MAX_CHOICES} prompts, got {len(prompt)}")
    out = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            out.append(PromptRequest(prompt=item))
        elif is_token_ids(item):
            out.append(PromptRequest(prompt_token_ids=token_ids(f"prompt[{i}]", item)))
        else:
            raise InvalidArgumentError(f"prompt[{i}]", "must be a string or a list of token ids")
    return out


def _sampling(body: dict[str, Any]) -> dict[str, float | int]:
    """The SamplingControls fields given (``top_k`` -1 or 0: off, as in vLLM). Their ranges
    are checked by the gateway, as for gRPC (SamplingControls.validate)."""
    controls: dict[str, float | int] = {}
    for name in SAMPLING_FIELDS:
        if name == "top_k":
            value = check_type(body, name, (int,), "an integer")
            if value is not None and value < -1:
                raise InvalidArgumentError(name, f"must be >= -1 (-1 or 0: off), got {value}")
            if value == -1:
                value = 0
        else:
            value = check_type(body, name, (int, float), "a number")
        if value is not None:
            controls[name] = value
    return controls


def _top_logprobs(body: dict[str, Any], *, chat: bool) -> int | None:
    """The alternatives per token to report (None: no log-probabilities). Completions:
    ``logprobs`` (an integer, 0..5); chat: ``logprobs: true`` and ``top_logprobs`` (0..20)."""
    if not chat:
        value = check_type(body, "logprobs", (int,), "an integer")
        if value is not None:
            check_range("logprobs", value, 0, MAX_COMPLETION_LOGPROBS)
        return value
    wanted = check_type(body, "logprobs", (bool,), "true or false")
    top = check_type(body, "top_logprobs", (int,), "an integer")
    if top is not None:
        check_range("top_logprobs", top, 0, MAX_TOP_LOGPROBS)
        if top > 0 and not wanted:
            raise InvalidArgumentError("top_logprobs", "needs logprobs: true")
    return (top or 0) if wanted else None


def _choices_per_prompt(body: dict[str, Any], prompts: int) -> int:
    n = check_type(body, "n", (int,), "an integer")
    if n is None:
        return 1
    check_range("n", n, 1, MAX_N)
    if n * prompts > MAX_CHOICES:
        raise InvalidArgumentError(
            "n", f"{prompts} prompts x n={n} choices is over the limit of {MAX_CHOICES}"
        )
    return n


def parse_openai_request(body: Any, *, chat: bool) -> ApiRequest:
    """The body of ``POST /v1/completions`` (chat=False) or ``/v1/chat/completions``."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("request", "the body must be a JSON object")
    allowed = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    for name in body:
        if name not in allowed:
            raise InvalidArgumentError(name, "unrecognized request argument")
    _check_only_defaults(body, allowed & _ONLY_DEFAULT.keys())
    model = check_type(body, "model", (str,), "a string") or ""
    check_type(body, "user", (str,), "a string")
    extension = check_type(body, "speculant", (dict,), "an object")
    graph = _graph_field(extension)
    stream = bool(check_type(body, "stream", (bool,), "true or false"))
    options = check_type(body, "stream_options", (dict,), "an object") or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidArgumentError("stream_options.include_usage", "must be true or false")
    prompts, max_tokens, max_tokens_field = _prompts_and_limit(body, chat)
    n = _choices_per_prompt(body, len(prompts))
    structured = structured_output(body, chat=chat)
    request = ApiRequest(
        (), chat, stream, include_usage and stream, n, max_tokens_field, structured, model, graph
    )
    calling = structured.tool_calling
    try:
        shared = replace(
            prompts[0],
            max_tokens=max_tokens,
            temperature=check_type(body, "temperature", (int, float), "a number"),
            stop=tuple(stop_strings(body)),
            draft=_draft_fields(extension),
            sampling=SamplingControls(**_sampling(body)),
            top_logprobs=_top_logprobs(body, chat=chat),
            constraint=structured.constraint,
            tools=structured.tools,
            tools_must_show=calling is not None and calling.mode == "auto",
        )
    except InvalidArgumentError as exc:
        raise renamed(exc, request.client_field(exc.field)) from exc
    seed = check_type(body, "seed", (int,), "an integer")
    generates = [
        replace(
            shared,
            prompt=prompt.prompt,
            prompt_token_ids=prompt.prompt_token_ids,
            seed=_choice_seed_of(seed, j),
        )
        for prompt in prompts
        for j in range(n)
    ]
    return replace(request, generates=tuple(generates))


def _prompts_and_limit(
    body: dict[str, Any], chat: bool
) -> tuple[list[PromptRequest], int | None, str]:
    """The request's prompts (a chat's messages: one), its token limit and the field that
    gave it (chat: ``max_completion_tokens`` over ``max_tokens``)."""
    max_tokens = check_type(body, "max_tokens", (int,), "an integer")
    if not chat:
        return _prompts(body), max_tokens, "max_tokens"
    prompts = [PromptRequest(messages=tuple(chat_messages(body)))]
    newer = check_type(body, "max_completion_tokens", (int,), "an integer")
    if newer is not None:
        return prompts, newer, "max_completion_tokens"
    return prompts, max_tokens, "max_tokens"


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


def renamed(exc: InvalidArgumentError, field: str) -> InvalidArgumentError:
    """The same error, naming the field as the client did."""
    return InvalidArgumentError(field, exc.problem)
