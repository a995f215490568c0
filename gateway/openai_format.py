"""JSON bodies of the HTTP API -> the gateway's GenerateRequests.

Three request shapes are translated into ``speculant.v1.GenerateRequest`` messages (so the HTTP
API runs through exactly the code the gRPC gateway runs, see GatewayServicer.generation):
- ``POST /generate``: the GenerateRequest itself as JSON (the proto3 JSON mapping, as grpcurl
  takes it; ``draft.strategy`` may also be ``"greedy"`` / ``"sampling"``);
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request bodies, one
  GenerateRequest per *choice*. The sampling controls (``top_k``, ``top_p``, ``min_p``,
  ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``) go to
  ``GenerateRequest.sampling``, ``logprobs`` / ``top_logprobs`` to ``top_logprobs``; ``n``
  choices per prompt each get their own seed (:func:`choice_seed`); a completion's ``prompt``
  may be a string, a list of token ids, or a list of either (choices = prompts x n, indexed
  ``prompt_index * n + j`` as OpenAI does). Fields that would change what is sampled and are
  not supported (``logit_bias``, ``best_of`` > 1, ``echo``, ``suffix``) are refused with a 400
  naming the field, never ignored. The non-standard object ``speculant`` carries draft options
  (``{"k": 8, "strategy": "greedy", ...}``, the DraftOptions fields).

The answers' shapes are built by gateway.openai_answers.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import json_format

from speculant.errors import InvalidArgumentError
from speculant.strategies import STRATEGY_TO_PROTO
from speculant.v1 import common_pb2, gateway_pb2

_STRATEGY_NAMES = {  # "greedy" -> "DRAFT_STRATEGY_GREEDY" (the JSON form of the enum)
    name: common_pb2.DraftStrategy.Name(value) for name, value in STRATEGY_TO_PROTO.items()
}

MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # choices per request (prompts x n): each is a generation, a gateway slot
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound on a completion's `logprobs`
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on a chat completion's `top_logprobs`
MAX_TOKEN_ID = 2**31 - 1  # an int32 on the wire

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
}
_ONLY_DEFAULT: dict[str, tuple[Any, ...]] = {
    "best_of": (1,),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
}
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix"}
_CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs"}


@dataclass(frozen=True)
class ApiRequest:
    """An OpenAI request translated: one GenerateRequest per choice, and how to answer."""

    generates: tuple[gateway_pb2.GenerateRequest, ...]  # [choice index]
    chat: bool  # a chat completion (message / delta) rather than a text completion
    stream: bool  # answer with server-sent events
    include_usage: bool  # stream_options.include_usage: a last chunk with usage
    n: int = 1  # choices per prompt (choice i answers prompt i // n)
    max_tokens_field: str = "max_tokens"  # or max_completion_tokens, as the client sent it

    @property
    def logprobs(self) -> bool:
        """Whether the answer reports log-probabilities."""
        return self.generates[0].HasField("top_logprobs")

    def client_field(self, field: str) -> str:
        """A GenerateRequest field path as this client named it."""
        if field == "max_tokens":
            return self.max_tokens_field
        if field == "top_logprobs" and not self.chat:
            return "logprobs"
        if field.startswith("prompt"):  # prompt, prompt_token_ids, prompt_token_ids[3]
            return "messages" if self.chat else "prompt"
        return api_field(field)


def api_field(field: str) -> str:
    """A GenerateRequest field path as the HTTP client named it (``draft.k`` -> ``speculant.k``,
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


def _parse_proto(body: dict[str, Any]) -> gateway_pb2.GenerateRequest:
    """body (proto3 JSON of a GenerateRequest) as the message; InvalidArgumentError naming the
    field if it does not parse."""
    draft = body.get("draft")
    if isinstance(draft, dict) and draft.get("strategy") in _STRATEGY_NAMES:
        body = {**body, "draft": {**draft, "strategy": _STRATEGY_NAMES[draft["strategy"]]}}
    try:
        return json_format.ParseDict(body, gateway_pb2.GenerateRequest())
    except json_format.ParseError as exc:
        message = str(exc).splitlines()[0]
        raise InvalidArgumentError(_parse_error_field(message) or "request", message) from exc


def parse_generate_request(body: Any) -> gateway_pb2.GenerateRequest:
    """The body of ``POST /generate``: a GenerateRequest in the proto3 JSON mapping."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("request", "the body must be a JSON object")
    return _parse_proto(body)


def _check_type(body: dict[str, Any], name: str, types: tuple[type, ...], what: str) -> Any:
    """body[name] (None when absent or null), which must be one of types (never a bool unless
    bool is one of them; never a NaN or infinite number)."""
    value = body.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise InvalidArgumentError(name, f"must be {what}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(name, f"must be a finite number, got {value}")
    return value


def _check_range(name: str, value: int | float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise InvalidArgumentError(name, f"must be in [{low:g}, {high:g}], got {value}")


def _check_only_defaults(body: dict[str, Any], names: set[str]) -> None:
    for name in sorted(names):
        value = body.get(name)
        if value is not None and value not in _ONLY_DEFAULT[name]:
            default = _ONLY_DEFAULT[name][0]
            raise InvalidArgumentError(
                name, f"only {default!r} is supported (the output must stay exact), got {value!r}"
            )


def _stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise InvalidArgumentError("stop", "must be a string or a list of strings")


def _message_content(index: int, content: Any) -> str:
    """A message's text: a string, or OpenAI's list of content parts of type text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise InvalidArgumentError(
                    f"messages[{index}].content[{j}]", "only parts of type 'text' are supported"
                )
            texts.append(part.get("text"))
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise InvalidArgumentError(
        f"messages[{index}].content", "must be a string or a list of text parts"
    )


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages", "must be a non-empty list of messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidArgumentError(f"messages[{i}]", "must be an object with a string role")
        out.append(
            {"role": message["role"], "content": _message_content(i, message.get("content"))}
        )
    return out


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _token_ids(field: str, ids: list[int]) -> list[int]:
    for position, token in enumerate(ids):
        if not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidArgumentError(f"{field}[{position}]", f"not a token id: {token}")
    return ids


def _prompts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion's prompts, each as GenerateRequest fields: ``{"prompt": text}`` or
    ``{"prompt_token_ids": [...]}``. OpenAI's prompt is a string, a list of token ids, a list
    of strings, or a list of token-id lists."""
    prompt = body.get("prompt")
    what = "a string, a list of token ids, or a non-empty list of either"
    if isinstance(prompt, str):
        return [{"prompt": prompt}]
    if _is_token_ids(prompt):
        return [{"prompt_token_ids": _token_ids("prompt", prompt)}]
    if not isinstance(prompt, list) or not prompt:
        raise InvalidArgumentError("prompt", f"must be {what}")
    if len(prompt) > MAX_CHOICES:
        raise InvalidArgumentError("prompt", f"at most {MAX_CHOICES} prompts, got {len(prompt)}")
    out = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            out.append({"prompt": item})
        elif _is_token_ids(item):
            out.append({"prompt_token_ids": _token_ids(f"prompt[{i}]", item)})
        else:
            raise InvalidArgumentError(f"prompt[{i}]", "must be a string or a list of token ids")
    return out


def _sampling(body: dict[str, Any]) -> dict[str, float | int]:
    """The SamplingControls fields given (``top_k`` -1 or 0: off, as in vLLM). Their ranges
    are checked by the gateway, as for gRPC (SamplingControls.validate)."""
    controls: dict[str, float | int] = {}
    for name in SAMPLING_FIELDS:
        if name == "top_k":
            value = _check_type(body, name, (int,), "an integer")
            if value is not None and value < -1:
                raise InvalidArgumentError(name, f"must be >= -1 (-1 or 0: off), got {value}")
            if value == -1:
                value = 0
        else:
            value = _check_type(body, name, (int, float), "a number")
        if value is not None:
            controls[name] = value
    return controls


def _top_logprobs(body: dict[str, Any], *, chat: bool) -> int | None:
    """The alternatives per token to report (None: no log-probabilities). Completions:
    ``logprobs`` (an integer, 0..5); chat: ``logprobs: true`` and ``top_logprobs`` (0..20)."""
    if not chat:
        value = _check_type(body, "logprobs", (int,), "an integer")
        if value is not None:
            _check_range("logprobs", value, 0, MAX_COMPLETION_LOGPROBS)
        return value
    wanted = _check_type(body, "logprobs", (bool,), "true or false")
    top = _check_type(body, "top_logprobs", (int,), "an integer")
    if top is not None:
        _check_range("top_logprobs", top, 0, MAX_TOP_LOGPROBS)
        if top > 0 and not wanted:
            raise InvalidArgumentError("top_logprobs", "needs logprobs: true")
    return (top or 0) if wanted else None


def _choices_per_prompt(body: dict[str, Any], prompts: int) -> int:
    n = _check_type(body, "n", (int,), "an integer")
    if n is None:
        return 1
    _check_range("n", n, 1, MAX_N)
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
    _check_type(body, "model", (str,), "a string")
    _check_type(body, "user", (str,), "a string")
    stream = bool(_check_type(body, "stream", (bool,), "true or false"))
    options = _check_type(body, "stream_options", (dict,), "an object") or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidArgumentError("stream_options.include_usage", "must be true or false")
    fields: dict[str, Any] = {"stop": _stop_strings(body)}
    max_tokens = _check_type(body, "max_tokens", (int,), "an integer")
    max_tokens_field = "max_tokens"
    if chat:
        prompts = [{"messages": _messages(body)}]
        newer = _check_type(body, "max_completion_tokens", (int,), "an integer")
        if newer is not None:
            max_tokens, max_tokens_field = newer, "max_completion_tokens"
    else:
        prompts = _prompts(body)
    n = _choices_per_prompt(body, len(prompts))
    sampling = _sampling(body)
    for name, value in (
        ("max_tokens", max_tokens),
        ("temperature", _check_type(body, "temperature", (int, float), "a number")),
        ("seed", _check_type(body, "seed", (int,), "an integer")),
        ("draft", _check_type(body, "speculant", (dict,), "an object")),
        ("sampling", sampling or None),
        ("top_logprobs", _top_logprobs(body, chat=chat)),
    ):
        if value is not None:
            fields[name] = value
    request = ApiRequest((), chat, stream, include_usage and stream, n, max_tokens_field)
    try:
        generates = [
            _parse_proto({**fields, **prompt, **_seed_field(fields, j)})
            for prompt in prompts
            for j in range(n)
        ]
    except InvalidArgumentError as exc:
        raise renamed(exc, request.client_field(exc.field)) from exc
    return replace(request, generates=tuple(generates))


def _seed_field(fields: dict[str, Any], index: int) -> dict[str, int]:
    """The seed of choice `index` of a prompt. Unseeded, choice 0 takes the gateway's default
    (random unless one is configured) and the others a random seed each, so that no gateway
    default makes the choices identical."""
    seed = fields.get("seed")
    if seed is None:
        return {"seed": secrets.randbits(64)} if index > 0 else {}
    if index == 0 or not isinstance(seed, int) or seed < 0:
        return {}  # a bad seed is refused by the parser, naming the field
    return {"seed": choice_seed(seed, index)}


def renamed(exc: InvalidArgumentError, field: str) -> InvalidArgumentError:
    """The same error, naming the field as the client did."""
    return InvalidArgumentError(field, exc.problem)
