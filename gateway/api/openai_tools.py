"""Chat answers that call tools, in OpenAI's shapes: the message of a unary answer and the
deltas of a streamed one, read from the generated text (speculant.structured: the text's form
follows ``tool_choice``).

- A message with calls has ``content`` null (or the text outside the calls, with ``auto``) and
  ``tool_calls: [{"id": "call_<hex>", "type": "function", "function": {"name", "arguments":
  <JSON text>}}]``; its choice's ``finish_reason`` is ``"tool_calls"`` where it would have been
  ``"stop"``. Text that is not read as calls (a generation cut by ``max_tokens`` inside one) is
  the message's content, with no calls and the finish reason ``"length"``.
- Streamed, a call's first delta is ``{"tool_calls": [{"index", "id", "type": "function",
  "function": {"name", "arguments": ""}}]}`` and the next ones carry pieces of its arguments
  (``{"tool_calls": [{"index", "function": {"arguments": PIECE}}]}``); content comes as
  ``{"content": TEXT}`` deltas (auto's text around its calls).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from speculant.structured import ToolCalling
from speculant.tool_stream import ToolCallDelta


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
