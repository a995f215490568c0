"""Prompt files: JSON lines with a text ``prompt`` or chat ``messages``, and a ``kind``.

``speculant distill --prompts`` and every benchmark (``bench generate``, ``bench distill``,
``speculant tune``) read prompt files here. A record's ``messages`` (a list of ``{"role",
"content"}``) are rendered with the model's chat template and a generation prompt, as the
gateway's chat route does (:func:`speculant.prompting.encode_prompt`); a ``prompt`` is tokenized
as a text prompt. An optional ``kind`` (e.g. "ask", "rag", "example") groups the records: the
benchmarks report every figure per kind as well as over all prompts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class PromptsError(ValueError):
    """A prompts file that cannot be used (one line: the file, the line and what is wrong)."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: text, or chat messages; kind "" when the record has none."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs
    kind: str = ""

    @property
    def message_dicts(self) -> list[dict[str, str]] | None:
        """The messages as the tokenizer's chat template takes them (None for a text prompt)."""
        if not self.messages:
            return None
        return [{"role": role, "content": content} for role, content in self.messages]

    def token_ids(self, tokenizer: Any) -> list[int]:
        """The ids the model sees for this prompt (as a server tokenizes it)."""
        from speculant.prompting import encode_prompt

        return encode_prompt(tokenizer, self.text, self.message_dicts)

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
    """One record: {"prompt": str} or {"messages": [{"role", "content"}, ...]}, "kind" optional."""
    if not isinstance(record, dict):
        raise PromptsError(f"{where}: a record must be a JSON object with 'prompt' or 'messages'")
    kind = record.get("kind", "")
    if not isinstance(kind, str):
        raise PromptsError(f"{where}: 'kind' must be a string")
    prompt, messages = record.get("prompt"), record.get("messages")
    if isinstance(prompt, str) and prompt.strip():
        return PromptRecord(text=prompt, kind=kind)
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
        return PromptRecord(messages=tuple(pairs), kind=kind)
    raise PromptsError(f"{where}: a record needs a non-empty 'prompt' string or 'messages' list")


def kinds_of(prompts: Sequence[PromptRecord]) -> list[str]:
    """The kinds the prompts have, in order of first appearance ([] when none has one)."""
    seen: dict[str, None] = {}
    for prompt in prompts:
        if prompt.kind:
            seen.setdefault(prompt.kind, None)
    return list(seen)
