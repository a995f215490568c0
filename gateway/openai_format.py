"""JSON bodies of the HTTP API <-> the gateway's GenerateRequest and results.

Three request shapes are translated into one ``speculant.v1.GenerateRequest`` (so the HTTP API
runs through exactly the code the gRPC gateway runs, see GatewayServicer.generation):
- ``POST /generate``: the GenerateRequest itself as JSON (the proto3 JSON mapping, as grpcurl
  takes it; ``draft.strategy`` may also be ``"greedy"`` / ``"sampling"``);
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request bodies. Fields
  that would change what is sampled and are not supported (``n`` > 1, ``top_p`` < 1, penalties,
  logprobs, ...) are refused with a 400 naming the field, never ignored, because the output
  must stay exactly the model's distribution. The non-standard object ``speculant`` carries
  draft options (``{"k": 8, "strategy": "greedy", ...}``, the DraftOptions fields).

Results go back in OpenAI's shapes (a completion, a chat completion, and their stream chunks)
with the speculative decoding statistics in an extra field ``speculant_stats``.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import json_format

from gateway.coordinator import GenerationResult
from gateway.stopping import FinishReason
from speculant.errors import InvalidArgumentError
from speculant.strategies import STRATEGY_TO_PROTO
from speculant.v1 import common_pb2, gateway_pb2

# OpenAI's finish reasons: the model ended or a stop string matched -> "stop"; a length limit
# (max_tokens, or the model's context) -> "length".
OPENAI_FINISH_REASONS = {
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.MAX_TOKENS: "length",
    FinishReason.CONTEXT_LENGTH: "length",
}
_STRATEGY_NAMES = {  # "greedy" -> "DRAFT_STRATEGY_GREEDY" (the JSON form of the enum)
    name: common_pb2.DraftStrategy.Name(value) for name, value in STRATEGY_TO_PROTO.items()
}

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
    "top_p",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
}
_ONLY_DEFAULT: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "top_p": (1,),
    "best_of": (1,),
    "frequency_penalty": (0,),
    "presence_penalty": (0,),
    "logit_bias": ({},),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "echo": (False,),
    "suffix": ("",),
}
_COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "best_of", "echo", "suffix", "logprobs"}
_CHAT_FIELDS = _COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}


@dataclass(frozen=True)
class ApiRequest:
    """An OpenAI request translated: the GenerateRequest, and how to answer it."""

    generate: gateway_pb2.GenerateRequest
    chat: bool  # a chat completion (message / delta) rather than a text completion
    stream: bool  # answer with server-sent events
    include_usage: bool  # stream_options.include_usage: a last chunk with usage
    max_tokens_field: str = "max_tokens"  # or max_completion_tokens, as the client sent it

    def client_field(self, field: str) -> str:
        """A GenerateRequest field path as this client named it."""
        return self.max_tokens_field if field == "max_tokens" else api_field(field)


def api_field(field: str) -> str:
    """A GenerateRequest field path as the HTTP client named it (``draft.k`` -> ``speculant.k``)."""
    if field == "draft" or field.startswith("draft."):
        return "speculant" + field.removeprefix("draft")
    return field


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
    bool is one of them)."""
    value = body.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise InvalidArgumentError(name, f"must be {what}, got {type(value).__name__}")
    return value


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


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidArgumentError(
            "prompt", "must be a string (or a list of one string; token ids are not supported)"
        )
    return prompt


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
    stream = bool(_check_type(body, "stream", (bool,), "true or false"))
    options = _check_type(body, "stream_options", (dict,), "an object") or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidArgumentError("stream_options.include_usage", "must be true or false")
    fields: dict[str, Any] = {"stop": _stop_strings(body)}
    max_tokens = _check_type(body, "max_tokens", (int,), "an integer")
    max_tokens_field = "max_tokens"
    if chat:
        fields["messages"] = _messages(body)
        newer = _check_type(body, "max_completion_tokens", (int,), "an integer")
        if newer is not None:
            max_tokens, max_tokens_field = newer, "max_completion_tokens"
    else:
        fields["prompt"] = _prompt(body)
    for name, value in (
        ("max_tokens", max_tokens),
        ("temperature", _check_type(body, "temperature", (int, float), "a number")),
        ("seed", _check_type(body, "seed", (int,), "an integer")),
        ("draft", _check_type(body, "speculant", (dict,), "an object")),
    ):
        if value is not None:
            fields[name] = value
    request = ApiRequest(
        gateway_pb2.GenerateRequest(), chat, stream, include_usage and stream, max_tokens_field
    )
    try:
        generate = _parse_proto(fields)
    except InvalidArgumentError as exc:
        raise renamed(exc, request.client_field(exc.field)) from exc
    return replace(request, generate=generate)


def renamed(exc: InvalidArgumentError, field: str) -> InvalidArgumentError:
    """The same error, naming the field as the client did."""
    return InvalidArgumentError(field, str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc))


def generate_response(result: GenerationResult) -> dict[str, Any]:
    """The answer of ``POST /generate`` (the fields of GenerateResponse, as `speculant generate
    --json` prints them)."""
    return {
        "text": result.text,
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason.value,
        "stats": result.stats.as_dict(),
    }


def usage(result: GenerationResult) -> dict[str, int]:
    """OpenAI's token counts: the prompt's tokens (chat template included) and those generated
    (a final EOS not counted)."""
    prompt_tokens = result.stats.prompt_tokens
    completion_tokens = len(result.token_ids)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ResponseWriter:
    """Builds the JSON objects of one OpenAI answer: the whole response, or its stream chunks.

    All objects of one answer share an id (``cmpl-...`` or ``chatcmpl-...``), a creation time
    and the served model name.
    """

    def __init__(self, request: ApiRequest, model: str) -> None:
        self.chat = request.chat
        self.model = model
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish_reason: str | None, chunk: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if not self.chat:
            choice.update(text=text or "", logprobs=None)
        elif chunk:
            choice.update(delta={} if text is None else {"content": text}, logprobs=None)
        else:
            choice.update(message={"role": "assistant", "content": text}, logprobs=None)
        choice["finish_reason"] = finish_reason
        return choice

    def response(self, result: GenerationResult) -> dict[str, Any]:
        """The whole (unary) response."""
        finish = OPENAI_FINISH_REASONS[result.finish_reason]
        return {
            **self._envelope(chunk=False),
            "choices": [self._choice(result.text, finish, chunk=False)],
            "usage": usage(result),
            "speculant_stats": result.stats.as_dict(),
        }

    def first_chunk(self) -> dict[str, Any] | None:
        """A chat stream opens with the assistant's role (a text completion needs nothing)."""
        if not self.chat:
            return None
        chunk = {**self._envelope(chunk=True), "choices": [self._choice("", None, chunk=True)]}
        chunk["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return chunk

    def text_chunk(self, text: str) -> dict[str, Any]:
        return {**self._envelope(chunk=True), "choices": [self._choice(text, None, chunk=True)]}

    def final_chunk(self, result: GenerationResult) -> dict[str, Any]:
        """The chunk with the finish reason, and the statistics."""
        finish = OPENAI_FINISH_REASONS[result.finish_reason]
        return {
            **self._envelope(chunk=True),
            "choices": [self._choice(None, finish, chunk=True)],
            "speculant_stats": result.stats.as_dict(),
        }

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return {**self._envelope(chunk=True), "choices": [], "usage": usage(result)}
