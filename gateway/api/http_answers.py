"""The HTTP API's answers: ``/generate``'s JSON and OpenAI's shapes (a completion, a chat
completion, and their stream chunks), with the speculative decoding statistics of each choice
in an extra field ``speculant_stats``.

Log-probabilities, when asked for, are in OpenAI's shapes: a completion's choice has
``logprobs: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}``
(text_offset: where each token starts in the choice's text), a chat choice
``logprobs: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``;
stream chunks carry those of the tokens they bring.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from gateway.api.http_logprobs import LogprobEntry, TokenText
from gateway.api.openai_format import ApiRequest
from gateway.api.openai_tools import ToolDeltas, tool_message
from gateway.generation import FinishReason, GenerationResult

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
    (gateway.api.openai_tools) are followed per choice, so one writer serves one answer.
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
