"""Reading a tool-calling answer as it is generated: the text of one of the three forms of
speculant.structured (named, required, auto) cut into *pieces* as OpenAI streams them.

Terms:
- a *piece* (:class:`ToolCallDelta`) is text of the answer's content, or of one call: a call's
  first piece names its function, the next ones carry its arguments' JSON text.
- arguments are *compacted*: whitespace outside JSON strings is dropped (auto's calls are
  written as the model was trained to, with spaces), so a call's argument pieces, joined, are
  its arguments as the whole answer gives them.
- content is *trimmed*: whitespace before the first content character, and whitespace that no
  content follows (between calls, at the end), is not reported; joined, the content pieces are
  the whole answer's content.
- text is *held back* while it may be the start of auto's ``<tool_call>`` tag, until the next
  text shows whether it is.

One :class:`ToolCallReader` reads one answer, delta by delta (:meth:`~ToolCallReader.feed`),
then :meth:`~ToolCallReader.finish`; the whole answer is read the same way, so a streamed answer
and a unary one agree (speculant.structured.ToolCalling.parse).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
# A call object up to its arguments' value: {"name": "F", "arguments": (or "parameters")
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_MAX_HEAD = 256  # a head not read by then is read with the whole call


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of an answer: ``content`` text, or (index >= 0) a piece of call `index`: its
    function's ``name`` (the call's first piece) or ``arguments`` text."""

    content: str = ""
    index: int = -1
    name: str = ""
    arguments: str = ""


class JsonValue:
    """Follows one JSON value character by character: where it ends (its text is valid JSON,
    as the constraint makes it; nothing is checked)."""

    def __init__(self) -> None:
        self.started = self.done = False
        self._depth = 0
        self._in_string = self._escape = False

    def feed(self, char: str) -> bool:
        """Whether char belongs to the value (False for whitespace before it and for the
        character after a bare number, true, false or null, which ends it)."""
        if self.done:
            return False
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                self.done = self._depth == 0
            return True
        if not self.started:
            if char.isspace():
                return False
            self.started = True
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            if self._depth == 0:  # the container around a bare value closes: it has ended
                self.done = True
                return False
            self._depth -= 1
            self.done = self._depth == 0
        elif self._depth == 0 and (char == "," or char.isspace()):
            self.done = True
            return False
        return True

    @property
    def in_string(self) -> bool:
        return self._in_string


@dataclass
class _Call:
    """A call being read: its object's text so far, and (once its head is read) its name and
    arguments."""

    index: int
    raw: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    object: JsonValue = field(default_factory=JsonValue)
    value: JsonValue | None = None  # the arguments' value, once the head is read


@dataclass(frozen=True)
class ToolCall:
    """A call read back from an answer: its function's name and its arguments as (compact)
    JSON text."""

    name: str
    arguments: str


class ToolCallReader:
    """Reads one answer of a form (``named``: the text is `name`'s arguments; ``required``: a
    JSON array of calls; ``auto``: content with tagged calls) into pieces (see the module).

    It reads character by character, in one of these states: ``value`` (named: the arguments),
    ``open`` and ``between`` (required: before the array, between its calls), ``content``
    (auto: text, possibly the start of a tag), ``before_call`` (auto: after the opening tag),
    ``call`` (in a call's object: its head ``{"name": F, "arguments":``, then its arguments,
    then the rest of the object), ``close`` (auto: before the closing tag) and ``done``."""

    def __init__(self, mode: str, name: str = "") -> None:
        self.mode = mode
        self.calls: list[ToolCall] = []  # calls read whole, in order
        self.complete = False  # named, required: the value (and so every call) is complete
        self.unfinished = ""  # auto: the text of a call the answer did not finish (content)
        self.content: list[str] = []  # the content pieces reported
        self._state = {"named": "value", "required": "open"}.get(mode, "content")
        self._call: _Call | None = None
        self._started = 0  # calls whose first piece was reported
        self._held = ""  # auto: text that may start a tag (content), or the closing tag
        self._space = ""  # content whitespace not reported yet (see the module)
        if mode == "named":
            self._call = _Call(0, name=name, value=JsonValue())

    def feed(self, text: str) -> list[ToolCallDelta]:
        """The pieces `text` (the answer's next delta) completes."""
        out: list[ToolCallDelta] = []
        if self.mode == "named" and self._started == 0 and self._call is not None:
            self._start_call(self._call, out)
        for char in text:
            self._char(char, out)
        self._flush(out)
        return out

    def finish(self) -> list[ToolCallDelta]:
        """The answer has ended: the content held back, if it was not a tag after all."""
        out: list[ToolCallDelta] = []
        if self._state == "content" and self._held:
            self._say(self._held, out)
            self._held = ""
        elif self._state == "before_call":
            self.unfinished = self._space + OPEN_TAG
        elif self._state == "call" and self.mode == "auto" and self._call is not None:
            self.unfinished = self._space + OPEN_TAG + self._call.raw
        return out

    # -- characters ------------------------------------------------------------------

    def _char(self, char: str, out: list[ToolCallDelta]) -> None:
        state = self._state
        if state == "content":
            self._held += char
            if self._held == OPEN_TAG:
                self._held, self._state = "", "before_call"
            while self._held and not OPEN_TAG.startswith(self._held):
                self._say(self._held[0], out)
                self._held = self._held[1:]
        elif state in ("open", "between", "before_call"):
            self._between_calls(char, out)
        elif state == "value":
            self._named_value(char, out)
        elif state == "call":
            self._call_char(char, out)
        elif state == "close":
            self._close_tag(char, out)

    def _between_calls(self, char: str, out: list[ToolCallDelta]) -> None:
        if char.isspace():
            return
        if self._state == "open":
            self._state = "between" if char == "[" else "done"
        elif char == "{":
            self._call = _Call(self._started, raw=char)
            self._call.object.feed(char)
            self._state = "call"
        elif char == "]" and self._state == "between":
            self.complete, self._state = True, "done"
        elif self._state == "before_call":  # not a call after all: content again
            self._say(OPEN_TAG, out)
            self._state = "content"
            self._char(char, out)

    def _named_value(self, char: str, out: list[ToolCallDelta]) -> None:
        call = self._call
        assert call is not None and call.value is not None
        if call.value.feed(char):
            self._argument(call, char, out)
        if call.value.done:
            self._end_call(call, out)
            self.complete = bool(self.calls)
            self._state = "done"

    def _call_char(self, char: str, out: list[ToolCallDelta]) -> None:
        call = self._call
        assert call is not None
        call.object.feed(char)
        call.raw += char
        if call.value is None and len(call.raw) <= _MAX_HEAD:
            head = _HEAD.fullmatch(call.raw[:-1])
            if head and not char.isspace():
                call.name, call.value = head.group(1), JsonValue()
                self._start_call(call, out)
        if call.value is not None and not call.value.done and call.value.feed(char):
            self._argument(call, char, out)
        if call.object.done:
            self._end_call(call, out)
            self._state = "between" if self.mode == "required" else "close"

    def _close_tag(self, char: str, out: list[ToolCallDelta]) -> None:
        if not self._held and char.isspace():
            return
        self._held += char
        if self._held == CLOSE_TAG:
            self._held, self._state = "", "content"
        elif not CLOSE_TAG.startswith(self._held):  # no closing tag: the rest is content
            held, self._held, self._state = self._held, "", "content"
            for c in held:
                self._char(c, out)

    # -- calls and content -------------------------------------------------------------

    def _start_call(self, call: _Call, out: list[ToolCallDelta]) -> None:
        out.append(ToolCallDelta(index=call.index, name=call.name))
        self._started += 1

    def _argument(self, call: _Call, char: str, out: list[ToolCallDelta]) -> None:
        if char.isspace() and not call.value.in_string:  # type: ignore[union-attr]
            return
        call.arguments.append(char)
        if out and out[-1].index == call.index and not out[-1].name:
            out[-1] = ToolCallDelta(index=call.index, arguments=out[-1].arguments + char)
        else:
            out.append(ToolCallDelta(index=call.index, arguments=char))

    def _end_call(self, call: _Call, out: list[ToolCallDelta]) -> None:
        """A call object (or named's value) has ended: keep it if its arguments are JSON. One
        whose head was not read as it came (another key order) is read whole now, and reported
        in two pieces."""
        self._call = None
        arguments = "".join(call.arguments)
        if call.value is None:
            try:
                whole = json.loads(call.raw)
                call.name = whole["name"]
                value = whole["arguments"] if "arguments" in whole else whole["parameters"]
            except (ValueError, KeyError, TypeError):
                return
            if not isinstance(call.name, str):
                return
            arguments = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            self._start_call(call, out)
            out.append(ToolCallDelta(index=call.index, arguments=arguments))
        try:
            json.loads(arguments)
        except ValueError:
            return
        self.calls.append(ToolCall(call.name, arguments))

    def _say(self, text: str, out: list[ToolCallDelta]) -> None:
        """Content text, trimmed (see the module)."""
        if not self.content:
            text = text.lstrip()
        body = text.rstrip()
        if not body:
            if self.content:
                self._space += text
            return
        piece, self._space = self._space + body, text[len(body) :]
        self.content.append(piece)
        out.append(ToolCallDelta(content=piece))

    def _flush(self, out: list[ToolCallDelta]) -> None:
        """Join adjacent content pieces of one delta."""
        i = 0
        while i + 1 < len(out):
            a, b = out[i], out[i + 1]
            if a.index < 0 and b.index < 0:
                out[i : i + 2] = [ToolCallDelta(content=a.content + b.content)]
            else:
                i += 1
