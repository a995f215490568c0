"""Where distillation prompts come from: corpus document prefixes or a prompts file.

Terms: a *document prefix* is the start of a corpus document cut after a whole number of words
(between ``min_words`` and ``max_words``, never the whole document), kept byte for byte (line
breaks included), so the model continues text that looks like what users send. A *prompts file*
is JSON lines with a ``prompt`` (text) or ``messages`` (chat) field per record.

Sampling is reproducible: the same inputs and seed give the same prompts. Documents are drawn
uniformly from the corpus in one streamed pass (reservoir sampling, memory bounded by the number
of prompts); when more prompts are asked for than the corpus has documents, documents are reused
with other prefix lengths.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.corpus import iter_documents, resolve_inputs
from builder.errors import BuildError

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Prompt:
    """One prompt: text (continued as is, or as a chat user message) or chat messages."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs


def word_ends(document: str, limit: int) -> list[int]:
    """End offsets of the document's first `limit` words (fewer when it has fewer)."""
    return [m.end() for m in itertools.islice(_WORD.finditer(document), limit)]


def corpus_prompts(
    inputs: Sequence[str],
    count: int,
    *,
    seed: int = 0,
    doc_separator: str | None = None,
    text_field: str = "text",
    min_words: int = 5,
    max_words: int = 40,
) -> list[Prompt]:
    """`count` document prefixes of min_words..max_words words (uniform) from the corpus."""
    if not 1 <= min_words <= max_words:
        raise BuildError(f"prefix words: need 1 <= min {min_words} <= max {max_words}")
    rng = np.random.default_rng(seed)
    files = resolve_inputs(inputs)
    reservoir: list[str] = []
    seen = 0
    for document in iter_documents(files, text_field=text_field, doc_separator=doc_separator):
        if len(word_ends(document, min_words + 1)) <= min_words:
            continue  # too short to cut a prefix from
        seen += 1
        if len(reservoir) < count:
            reservoir.append(document)
        else:
            slot = int(rng.integers(seen))
            if slot < count:
                reservoir[slot] = document
    if not reservoir:
        raise BuildError(
            f"no document of {' '.join(inputs)} has more than {min_words} words to cut a prompt "
            "from (is --doc-separator right?)"
        )
    rng.shuffle(reservoir)
    prompts = []
    for i in range(count):
        document = reservoir[i % len(reservoir)]
        ends = word_ends(document, max_words + 1)
        words = min(int(rng.integers(min_words, max_words + 1)), len(ends) - 1)
        prompts.append(Prompt(text=document[: ends[words - 1]]))
    return prompts


def file_prompts(path: str | Path, count: int | None = None) -> list[Prompt]:
    """The prompts of a JSON-lines file (``prompt`` or ``messages`` per record), cycled to
    `count` when given."""
    path = Path(path)
    prompts: list[Prompt] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(f"cannot read prompts file {path}: {exc}") from exc
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BuildError(f"{path}:{lineno}: not JSON ({exc.msg})") from exc
        prompts.append(_record_prompt(record, f"{path}:{lineno}"))
    if not prompts:
        raise BuildError(f"prompts file {path} has no prompts")
    if count is None:
        return prompts
    return [prompts[i % len(prompts)] for i in range(count)]


def _record_prompt(record: object, where: str) -> Prompt:
    if not isinstance(record, dict):
        raise BuildError(f"{where}: a record must be a JSON object with 'prompt' or 'messages'")
    if isinstance(record.get("prompt"), str) and record["prompt"].strip():
        return Prompt(text=record["prompt"])
    messages = record.get("messages")
    if isinstance(messages, list) and messages:
        pairs = []
        for i, message in enumerate(messages):
            if not (
                isinstance(message, dict)
                and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)
            ):
                raise BuildError(f"{where}: messages[{i}] needs string 'role' and 'content'")
            pairs.append((message["role"], message["content"]))
        return Prompt(messages=tuple(pairs))
    raise BuildError(f"{where}: a record needs a non-empty 'prompt' string or 'messages' list")


def graph_corpus(build_params: dict[str, Any]) -> tuple[list[str], str | None, str]:
    """(corpus files, doc separator, text field) a graph was built from, as its meta records
    them; BuildError when they are not readable from here."""
    inputs = [
        str(i)
        for i in build_params.get("inputs", [])
        if not str(i).startswith(("dataset:", "distill:"))
    ]
    if not inputs or not all(Path(i).exists() for i in inputs):
        raise BuildError(
            "no prompt source: give --corpus PATH... or --prompts FILE.jsonl (the graph's own "
            f"corpus {' '.join(inputs) or '(none recorded)'} is not readable here)"
        )
    return inputs, build_params.get("doc_separator"), build_params.get("text_field") or "text"
