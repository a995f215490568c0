"""The HTTP API's answers: ``/generate``'s JSON, OpenAI's shapes (a completion, a chat
completion, and their stream chunks) with the speculative decoding statistics of each choice in
an extra field ``speculant_stats``, and errors.

Log-probabilities, when asked for, are in OpenAI's shapes: a completion's choice has
``logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``
(text_offset: where each token starts in the choice's text), a chat choice
``logprobs: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``;
stream chunks carry those of the tokens they bring. A token's text is what it adds after the
tokens generated before it (:class:`TokenTexts`): a token decoded alone can lose its context
(SentencePiece drops the leading space of a text's first word), so, as gateway.rounds.output
does for the streamed text, a short window of the previous tokens is decoded with and without
the token and the difference taken. The window starts with an *anchor* token (the encoding of
"a"), so the first generated token keeps its leading space too. A byte token (``<0xE2>``) of a
character split over several tokens has no text of its own (U+FFFD); its ``bytes`` are the byte
itself.

Chat answers that call tools (the text's form follows ``tool_choice``; speculant.structured):
- a message with calls has ``content`` null (or the text outside the calls, with ``auto``) and
  ``tool_calls: [{"id": "call_<hex>", "type": "function", "function": {"name", "arguments":
  <JSON text>}}]``; its choice's ``finish_reason`` is ``"tool_calls"`` where it would have been
  ``"stop"``. Text that is not read as calls (a generation cut by ``max_tokens`` inside one) is
  the message's content, with no calls and the finish reason ``"length"``.
- Streamed, a call's first delta is ``{"tool_calls": [{"index", "id", "type": "function",
  "function": {"name", "arguments": ""}}]}`` and the next ones carry pieces of its arguments
  (``{"tool_calls": [{"index", "function": {"arguments": PIECE}}]}``); content comes as
  ``{"content": TEXT}`` deltas (auto's text around its calls).

Errors are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status of
the library's error class (:func:`http_error`), never a traceback.
"""

from __future__ import annotations

import logging
import math
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from transformers import PreTrainedTokenizerBase

from gateway.api.requests import ApiRequest, renamed
from gateway.generation import FinishReason, GenerationResult
from speculant.errors import InvalidArgumentError, OutOfRangeError, SpeculantError
from speculant.grpc_server import status_details
from speculant.structured import ToolCalling
from speculant.tool_stream import ToolCallDelta

if TYPE_CHECKING:
    from speculant.types import TokenLogprobs

log = logging.getLogger(__name__)

# gRPC status code of a library error -> HTTP status and OpenAI error type.
HTTP_ERRORS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (412, "failed_precondition"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (503, "service_unavailable"),
}
INTERNAL = (500, "internal_error")


class HttpError(Exception):
    """An answer other than 200: HTTP status, OpenAI error type, message, field."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code: str | None = None

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": status_details(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), self.status, headers)


def http_error(exc: BaseException, request: ApiRequest | None = None) -> HttpError:
    """The HttpError for an exception raised while serving (logged if unexpected)."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, HTTPException):  # Starlette's routing: 404, 405
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return HttpError(exc.status_code, kind, str(exc.detail))
    if not isinstance(exc, SpeculantError):
        log.error("unexpected error in the HTTP API", exc_info=exc)
        return HttpError(*INTERNAL, "internal error")
    if isinstance(exc, InvalidArgumentError) and request is not None:
        exc = renamed(exc, request.client_field(exc.field))
    status, kind = HTTP_ERRORS.get(exc.code, INTERNAL)
    error = HttpError(status, kind, str(exc))
    if isinstance(exc, InvalidArgumentError):
        error.param = exc.field
    elif isinstance(exc, OutOfRangeError):
        error.param = "messages" if request and request.chat else "prompt"
        error.code = "context_length_exceeded"
    return error


WINDOW = 4  # previous tokens decoded with each token
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# A log-probability of 0 probability (an alternative a warper removed) has no JSON number:
# reported as this, as vLLM does.
MIN_LOGPROB = -9999.0


@dataclass(frozen=True)
class TokenText:
    """A token as OpenAI reports it: its text and its UTF-8 bytes."""

    text: str
    bytes: list[int]


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token: its text, log-probability and most likely alternatives."""

    token: TokenText
    logprob: float
    top: tuple[tuple[TokenText, float], ...]  # most likely first


def finite_logprob(value: float) -> float:
    """value, or MIN_LOGPROB for -inf / NaN (JSON has no such numbers)."""
    return value if math.isfinite(value) else MIN_LOGPROB


class TokenTexts:
    """The texts of one choice's generated tokens, in order (it remembers the previous ones)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._anchor: list[int] = tokenizer.encode("a", add_special_tokens=False)[-1:]
        self._previous: list[int] = []

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _text(self, context: list[int], base: str, token_id: int) -> TokenText:
        full = self._decode([*context, token_id])
        text = full[len(base) :] if full.startswith(base) else self._decode([token_id])
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        byte = _BYTE_PIECE.fullmatch(piece) if isinstance(piece, str) else None
        return TokenText(text, [int(byte.group(1), 16)] if byte else list(text.encode()))

    def entries(self, logprobs: Sequence[TokenLogprobs]) -> list[LogprobEntry]:
        """The entries of the next tokens (one per TokenLogprobs, in order)."""
        out = []
        for reported in logprobs:
            context = self._anchor + self._previous[-WINDOW:]
            base = self._decode(context)
            top = tuple(
                (self._text(context, base, token), finite_logprob(logprob))
                for token, logprob in zip(
                    reported.top_token_ids, reported.top_logprobs, strict=True
                )
            )
            token = self._text(context, base, reported.token_id)
            out.append(LogprobEntry(token, finite_logprob(reported.logprob), top))
            self._previous.append(reported.token_id)
        return out


def call_id() -> str:
    """A new call id, as OpenAI's: ``call_`` and 24 hex digits."""
    return "call_" + uuid.uuid4().hex[:24]


def tool_message(calling: ToolCalling, text: str) -> tuple[dict[str, Any], bool]:
    """The assistant message of a generated text, and whether it makes calls."""
    content, calls = calling.parse(text)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    return message, bool(calls)


class ToolDeltas:
    """One streamed choice under tool calling: its text deltas as OpenAI's delta objects."""

    def __init__(self, calling: ToolCalling) -> None:
        self._reader = calling.reader()
        self._ids: dict[int, str] = {}  # call index -> its id

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas a piece of generated text makes (possibly none: text held back)."""
        return self._deltas(self._reader.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of the text held back until the end."""
        return self._deltas(self._reader.finish())

    @property
    def made_calls(self) -> bool:
        """Whether the answer has made a whole call."""
        return bool(self._reader.calls)

    def _deltas(self, pieces: Sequence[ToolCallDelta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for piece in pieces:
            if piece.index < 0:
                out.append({"content": piece.content})
                continue
            call: dict[str, Any] = {"index": piece.index}
            if piece.index not in self._ids:
                self._ids[piece.index] = call_id()
                call.update(id=self._ids[piece.index], type="function")
                call["function"] = {"name": piece.name, "arguments": ""}
                out.append({"tool_calls": [call]})
                if not piece.arguments:
                    continue
                call = {"index": piece.index}
            call["function"] = {"arguments": piece.arguments}
            out.append({"tool_calls": [call]})
        return out


# OpenAI's finish reasons: the model ended or a stop string matched -> "stop"; a length limit
# (max_tokens, or the model's context) -> "length".
OPENAI_FINISH_REASONS = {
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.MAX_TOKENS: "length",
    FinishReason.CONTEXT_LENGTH: "length",
}


def generate_response(result: GenerationResult) -> dict[str, Any]:
    """The answer of ``POST /generate`` (the fields of GenerateResponse, as `speculant generate
    --json` prints them; ``logprobs`` only when asked for)."""
    answer: dict[str, Any] = {
        "text": result.text,
        "token_ids": list(result.token_ids),
        "finish_reason": result.finish_reason.value,
        "stats": result.stats.as_dict(),
    }
    if result.logprobs:
        answer["logprobs"] = [
            {
                "token_id": lp.token_id,
                "logprob": lp.logprob,
                "top_token_ids": list(lp.top_token_ids),
                "top_logprobs": list(lp.top_logprobs),
            }
            for lp in result.logprobs
        ]
    return answer


def usage(results: Sequence[GenerationResult], n: int = 1) -> dict[str, int]:
    """OpenAI's token counts over every choice: each prompt's tokens once (chat template
    included; choice i answers prompt i // n) and all tokens generated (a final EOS not
    counted)."""
    prompt_tokens = sum(r.stats.prompt_tokens for i, r in enumerate(results) if i % n == 0)
    completion_tokens = sum(len(r.token_ids) for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chat_token(token: TokenText, logprob: float) -> dict[str, Any]:
    return {"token": token.text, "logprob": logprob, "bytes": token.bytes}


class ResponseWriter:
    """Builds the JSON objects of one OpenAI answer: the whole response, or its stream chunks.

    All objects of one answer share an id (``cmpl-...`` or ``chatcmpl-...``), a creation time
    and the served model name. A completion's text offsets and a streamed choice's tool calls
    (:class:`ToolDeltas`) are followed per choice, so one writer serves one answer.
    """

    def __init__(self, request: ApiRequest, model: str) -> None:
        self.chat = request.chat
        self.n = request.n
        self.with_logprobs = request.logprobs
        self.model = model
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._offsets = [0] * len(request.generates)  # characters reported, by choice
        self.tools = request.structured.tool_calling if self.chat else None
        self._deltas = [ToolDeltas(self.tools) for _ in request.generates] if self.tools else []

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        if self.chat:
            kind = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            kind = "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, index: int, entries: Sequence[LogprobEntry]) -> dict[str, Any] | None:
        if not self.with_logprobs:
            return None
        if self.chat:
            return {
                "content": [
                    {
                        **_chat_token(e.token, e.logprob),
                        "top_logprobs": [_chat_token(t, lp) for t, lp in e.top],
                    }
                    for e in entries
                ]
            }
        offsets = []
        for entry in entries:
            offsets.append(self._offsets[index])
            self._offsets[index] += len(entry.token.text)
        return {
            "tokens": [e.token.text for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.text: lp for t, lp in e.top} for e in entries],
            "text_offset": offsets,
        }

    def _choice(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None,
        chunk: bool,
        entries: Sequence[LogprobEntry] = (),
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        reported = text is not None and (bool(entries) or not chunk)
        logprobs = self._logprobs(index, entries) if reported else None
        if not self.chat:
            choice.update(text=text or "", logprobs=logprobs)
        elif chunk:
            choice.update(delta={} if text is None else {"content": text}, logprobs=logprobs)
        else:
            choice.update(message={"role": "assistant", "content": text}, logprobs=logprobs)
        choice["finish_reason"] = finish_reason
        return choice

    def response(
        self,
        results: Sequence[GenerationResult],
        entries: Sequence[Sequence[LogprobEntry]],
    ) -> dict[str, Any]:
        """The whole (unary) response: results[i] and its logprob entries[i] are choice i.
        The top-level speculant_stats are choice 0's (each choice has its own)."""
        choices = []
        for index, (result, choice_entries) in enumerate(zip(results, entries, strict=True)):
            finish = OPENAI_FINISH_REASONS[result.finish_reason]
            choice = self._choice(index, result.text, finish, chunk=False, entries=choice_entries)
            if self.tools is not None:
                choice["message"], calls = tool_message(self.tools, result.text)
                choice["finish_reason"] = "tool_calls" if calls and finish == "stop" else finish
            choice["speculant_stats"] = result.stats.as_dict()
            choices.append(choice)
        return {
            **self._envelope(chunk=False),
            "choices": choices,
            "usage": usage(results, self.n),
            "speculant_stats": results[0].stats.as_dict(),
        }

    def opening_chunks(self, choices: int) -> list[dict[str, Any]]:
        """A chat stream opens with the assistant's role, per choice (a text completion needs
        nothing)."""
        if not self.chat:
            return []
        out = []
        for index in range(choices):
            choice = self._choice(index, "", None, chunk=True)
            # content null with tools, so that a client's accumulated answer with calls only
            # has content null, as a unary one
            content = None if self.tools is not None else ""
            choice["delta"] = {"role": "assistant", "content": content}
            out.append({**self._envelope(chunk=True), "choices": [choice]})
        return out

    def text_chunks(
        self, index: int, text: str, entries: Sequence[LogprobEntry] = ()
    ) -> list[dict[str, Any]]:
        """New text of choice `index` (and the entries of the tokens that brought it): one
        chunk, or with tools the chunks of its content and call deltas (the entries in the
        first; none while text is held back and no entries came)."""
        if self.tools is None:
            return [self._chunk(index, text, entries)]
        deltas = self._deltas[index].feed(text) or ([{}] if entries else [])
        return [
            self._delta_chunk(index, d, entries if i == 0 else ()) for i, d in enumerate(deltas)
        ]

    def _chunk(self, index: int, text: str, entries: Sequence[LogprobEntry]) -> dict[str, Any]:
        choice = self._choice(index, text, None, chunk=True, entries=entries)
        return {**self._envelope(chunk=True), "choices": [choice]}

    def _delta_chunk(
        self, index: int, delta: dict[str, Any], entries: Sequence[LogprobEntry] = ()
    ) -> dict[str, Any]:
        chunk = self._chunk(index, "", entries)
        chunk["choices"][0]["delta"] = delta
        return chunk

    def final_chunks(self, index: int, result: GenerationResult) -> list[dict[str, Any]]:
        """The chunks that end choice `index`: text held back (with tools), then the one
        with its finish reason and its statistics."""
        finish = OPENAI_FINISH_REASONS[result.finish_reason]
        chunks = []
        if self.tools is not None:
            deltas = self._deltas[index]
            chunks = [self._delta_chunk(index, delta) for delta in deltas.finish()]
            if deltas.made_calls and finish == "stop":
                finish = "tool_calls"
        final = {
            **self._envelope(chunk=True),
            "choices": [self._choice(index, None, finish, chunk=True)],
            "speculant_stats": result.stats.as_dict(),
        }
        return [*chunks, final]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return {**self._envelope(chunk=True), "choices": [], "usage": usage(results, self.n)}
