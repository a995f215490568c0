"""Prompt files: JSON lines with a text ``prompt`` or chat ``messages``, and a ``kind``.

``speculant distill --prompts`` and every benchmark (``bench generate``, ``bench distill``,
``speculant tune``) read prompt files here. A record's ``messages`` (a list of ``{"role",
"content"}``) are rendered with the model's chat template and a generation prompt, as the
gateway's chat route does (:func:`speculant.prompting.encode_prompt`); a ``prompt`` is tokenized
as a text prompt. An optional ``kind`` (e.g. "ask", "rag", "example") groups the records: the
benchmarks report every figure per kind as well as over all prompts.

A record may also carry OpenAI's structured-output fields (:mod:`speculant.structured`):
``response_format`` (``json_object`` or ``json_schema``), or ``tools`` with ``tool_choice`` (and
``parallel_tool_calls``). Its *constraint* is then what every answer to it is generated under,
and its tools are passed to the chat template (:meth:`PromptRecord.token_ids`). An answer is
*valid* when it reads back: JSON for a ``response_format``, at least one tool call for tools
(:meth:`PromptRecord.answer_is_valid`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speculant.constraint import Constraint
    from speculant.structured import ToolCalling

STRUCTURED_FIELDS = ("response_format", "tools", "tool_choice", "parallel_tool_calls")


class PromptsError(ValueError):
    """A prompts file that cannot be used (one line: the file, the line and what is wrong)."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: text, or chat messages; kind "" when the record has none."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs
    kind: str = ""
    # OpenAI's structured-output fields as canonical JSON text ("": not given), so that a
    # record stays hashable; see structured_fields
    response_format: str = ""
    tools: str = ""
    tool_choice: str = ""
    parallel_tool_calls: bool = True

    @property
    def structured_fields(self) -> dict[str, Any]:
        """The record's structured-output fields given, as its JSON line has them."""
        out: dict[str, Any] = {}
        for name in ("response_format", "tools", "tool_choice"):
            if getattr(self, name):
                out[name] = json.loads(getattr(self, name))
        if not self.parallel_tool_calls:
            out["parallel_tool_calls"] = False
        return out

    @property
    def constrained(self) -> bool:
        """Whether answers to this prompt are generated under a constraint."""
        return self.constraint() is not None

    def openai_tools(self) -> list[dict[str, Any]] | None:
        """The record's tools as the chat template takes them (None without tools)."""
        if not self.tools:
            return None
        from speculant.structured import parse_tools

        return [tool.as_openai() for tool in parse_tools(json.loads(self.tools))]

    def tool_calling(self) -> ToolCalling | None:
        """How the record's tools are called (None: no tools, or tool_choice "none")."""
        if not self.tools:
            return None
        from speculant.structured import tool_calling

        choice = json.loads(self.tool_choice) if self.tool_choice else None
        return tool_calling(json.loads(self.tools), choice, self.parallel_tool_calls)

    def constraint(self) -> Constraint | None:
        """What every answer keeps to: the response_format's constraint, else the tools' (None:
        free text)."""
        if self.response_format:
            from speculant.structured import response_format_constraint

            return response_format_constraint(json.loads(self.response_format))
        calling = self.tool_calling()
        return calling.constraint() if calling is not None else None

    def answer_is_valid(self, text: str) -> bool | None:
        """Whether an answer reads back (None for a prompt without a constraint): JSON for a
        response_format, at least one tool call for tools (ToolCalling.parse)."""
        calling = self.tool_calling()
        if calling is not None:
            try:
                calls = calling.parse(text)[1]
            except (KeyError, TypeError, AttributeError):  # JSON, but not a list of calls
                return False
            return bool(calls) or calling.mode == "auto"  # auto may answer in text alone
        if self.constraint() is None:
            return None
        try:
            json.loads(text)
        except ValueError:
            return False
        return True

    @property
    def message_dicts(self) -> list[dict[str, str]] | None:
        """The messages as the tokenizer's chat template takes them (None for a text prompt)."""
        if not self.messages:
            return None
        return [{"role": role, "content": content} for role, content in self.messages]

    def token_ids(self, tokenizer: Any) -> list[int]:
        """The ids the model sees for this prompt (as a server tokenizes it): messages are
        rendered with the record's tools, where the chat template shows them."""
        from speculant.prompting import encode_prompt

        return encode_prompt(tokenizer, self.text, self.message_dicts, tools=self.openai_tools())

    def label(self, width: int = 60) -> str:
        """A short one-line description (the text, or the last message's content)."""
        text = self.messages[-1][1] if self.messages else self.text
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 3] + "..."


def load_prompts(path: str | Path, limit: int | None = None) -> list[PromptRecord]:
    """The prompts of a JSON-lines file, the first `limit` of them (PromptsError naming the
    line of a bad record)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptsError(f"cannot read prompts file {path}: {exc}") from exc
    prompts: list[PromptRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptsError(f"{path}:{number}: not JSON ({exc.msg})") from exc
        prompts.append(parse_record(record, f"{path}:{number}"))
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise PromptsError(f"prompts file {path} has no prompts")
    return prompts


def parse_record(record: object, where: str) -> PromptRecord:
    """One record: {"prompt": str} or {"messages": [{"role", "content"}, ...]}; "kind" and the
    structured-output fields (STRUCTURED_FIELDS) optional."""
    if not isinstance(record, dict):
        raise PromptsError(f"{where}: a record must be a JSON object with 'prompt' or 'messages'")
    kind = record.get("kind", "")
    if not isinstance(kind, str):
        raise PromptsError(f"{where}: 'kind' must be a string")
    structured = _structured_fields(record, where)
    prompt, messages = record.get("prompt"), record.get("messages")
    if isinstance(prompt, str) and prompt.strip():
        return PromptRecord(text=prompt, kind=kind, **structured)
    if isinstance(messages, list) and messages:
        pairs = []
        for i, message in enumerate(messages):
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise PromptsError(f"{where}: messages[{i}] needs string 'role' and 'content'")
            pairs.append((message["role"], message["content"]))
        return PromptRecord(messages=tuple(pairs), kind=kind, **structured)
    raise PromptsError(f"{where}: a record needs a non-empty 'prompt' string or 'messages' list")


def _structured_fields(record: dict[str, Any], where: str) -> dict[str, Any]:
    """PromptRecord's structured-output fields of a record, checked as a request's are
    (PromptsError naming the line and the field)."""
    from speculant.errors import InvalidArgumentError
    from speculant.structured import response_format_constraint, tool_calling

    fields: dict[str, Any] = {}
    for name in ("response_format", "tools", "tool_choice"):
        if record.get(name) is not None:
            fields[name] = json.dumps(record[name], sort_keys=True, ensure_ascii=False)
    parallel = record.get("parallel_tool_calls", True)
    try:
        response_format_constraint(record.get("response_format"))
        tool_calling(record.get("tools"), record.get("tool_choice"), parallel)
    except InvalidArgumentError as exc:
        raise PromptsError(f"{where}: {exc}") from exc
    if "response_format" in fields and "tools" in fields:
        raise PromptsError(f"{where}: give 'response_format' or 'tools', not both")
    return {**fields, "parallel_tool_calls": parallel}


def kinds_of(prompts: Sequence[PromptRecord]) -> list[str]:
    """The kinds the prompts have, in order of first appearance ([] when none has one)."""
    seen: dict[str, None] = {}
    for prompt in prompts:
        if prompt.kind:
            seen.setdefault(prompt.kind, None)
    return list(seen)
