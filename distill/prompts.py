"""Where distillation prompts come from: corpus document prefixes, corpus passages, a prompts file.

Terms: a *document prefix* is the start of a corpus document cut after a whole number of words
(between ``min_words`` and ``max_words``, never the whole document), kept byte for byte (line
breaks included), so the model continues text that looks like what users send. A *passage
prompt* (for chat models) is one user message: a *passage* of a corpus document (a run of
``min_words`` to ``max_words`` words from inside it, byte for byte) with an instruction around
it, one of :data:`PASSAGE_TEMPLATES` (what users of a domain assistant ask about a document they
paste), so the model answers questions about its corpus as it will when served. A *prompts file*
is JSON lines with a ``prompt`` (text) or ``messages`` (chat) field per record
(:mod:`speculant.prompt_records`).

Sampling is reproducible: the same inputs and seed give the same prompts. Documents (passages)
are drawn uniformly from the corpus in one streamed pass (reservoir sampling, memory bounded by
the number of prompts); when more prompts are asked for than the corpus has documents
(passages), documents are reused with other prefix lengths (passages with other templates).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from builder.corpus import iter_documents, resolve_inputs
from builder.errors import BuildError
from distill import defaults
from speculant.prompt_records import PromptRecord, PromptsError, load_prompts

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
_BLANK_LINE = re.compile(r"\n[ \t\r]*\n")

# One prompt: text (continued as is, or as a chat user message) or chat messages.
Prompt = PromptRecord

# Instructions of passage prompts, by name (see distill.defaults).
PASSAGE_TEMPLATES = defaults.PASSAGE_TEMPLATES


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
    documents = iter_documents(
        resolve_inputs(inputs), text_field=text_field, doc_separator=doc_separator
    )
    long_enough = (d for d in documents if len(word_ends(d, min_words + 1)) > min_words)
    reservoir = _reservoir(long_enough, count, rng)
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


def _reservoir(items: Iterable[str], count: int, rng: np.random.Generator) -> list[str]:
    """`count` of the items drawn uniformly in one pass (reservoir sampling; all of them when
    there are fewer): each item after the first `count` replaces a random slot, or none."""
    reservoir: list[str] = []
    for seen, item in enumerate(items, start=1):
        if len(reservoir) < count:
            reservoir.append(item)
        else:
            slot = int(rng.integers(seen))
            if slot < count:
                reservoir[slot] = item
    return reservoir


def passages(
    document: str, rng: np.random.Generator, min_words: int, max_words: int
) -> Iterator[str]:
    """The document cut into consecutive passages of min_words..max_words words, byte for
    byte, each ending at the best break in that range (a paragraph end, else a sentence end,
    else a line end; of equal ones, the nearest to a target length drawn uniformly in
    min_words..max_words), else at the target; the next passage starts there. A tail of fewer
    than min_words words is left out."""
    spans: list[tuple[int, int]] = []  # (start, end) of the words not yet in a passage
    breaks: list[int] = []  # breaks[i]: how natural a break before spans[i] is (0..3)
    target = int(rng.integers(min_words, max_words + 1))
    previous = None
    for match in _WORD.finditer(document):
        breaks.append(_break(document, previous, match))
        spans.append(match.span())
        previous = match
        if len(spans) > max_words:  # every break a passage may end at is known
            cut = _cut(breaks, target, min_words, max_words, at_end=False)
            yield document[spans[0][0] : spans[cut - 1][1]]
            del spans[:cut], breaks[:cut]
            target = int(rng.integers(min_words, max_words + 1))
    while len(spans) >= min_words:
        cut = _cut(breaks, target, min_words, max_words, at_end=True)
        yield document[spans[0][0] : spans[cut - 1][1]]
        del spans[:cut], breaks[:cut]
        target = int(rng.integers(min_words, max_words + 1))


def _break(document: str, previous: re.Match | None, word: re.Match) -> int:
    """How natural a passage break before `word` is: 3 after a paragraph (a blank line), 2
    after a sentence, 1 at a line start, else 0."""
    if previous is None:
        return 0
    gap = document[previous.end() : word.start()]
    if _BLANK_LINE.search(gap):
        return 3
    if _SENTENCE_END.search(previous.group()):
        return 2
    return 1 if "\n" in gap else 0


def _cut(breaks: list[int], target: int, min_words: int, max_words: int, *, at_end: bool) -> int:
    """How many of the words the next passage takes (see passages); at_end: the document
    ends after the last of them."""
    words = len(breaks)
    best, cut = 0, min(target, words)
    for i in range(min_words, min(words, max_words) + 1):
        strength = 3 if i == words and at_end else breaks[i]
        if strength > best or (strength == best > 0 and abs(i - target) < abs(cut - target)):
            best, cut = strength, i
    return cut


def corpus_passages(
    inputs: Sequence[str],
    count: int,
    *,
    seed: int = 0,
    doc_separator: str | None = None,
    text_field: str = "text",
    min_words: int = 40,
    max_words: int = 120,
    templates: Sequence[str] = (),
) -> list[Prompt]:
    """`count` passage prompts: passages of min_words..max_words words drawn uniformly from the
    corpus, each in one user message with a template of `templates` (names of
    PASSAGE_TEMPLATES; all when empty) in turn; each prompt's kind is its template's name."""
    if not 1 <= min_words <= max_words:
        raise BuildError(f"passage words: need 1 <= min {min_words} <= max {max_words}")
    names = list(templates) or list(PASSAGE_TEMPLATES)
    unknown = [n for n in names if n not in PASSAGE_TEMPLATES]
    if unknown:
        raise BuildError(
            f"unknown passage template {unknown[0]!r} (known: {', '.join(PASSAGE_TEMPLATES)})"
        )
    rng = np.random.default_rng(seed)
    documents = iter_documents(
        resolve_inputs(inputs), text_field=text_field, doc_separator=doc_separator
    )
    all_passages = (p for d in documents for p in passages(d, rng, min_words, max_words))
    reservoir = _reservoir(all_passages, count, rng)
    if not reservoir:
        raise BuildError(
            f"no document of {' '.join(inputs)} has {min_words} words for a passage (is "
            "--doc-separator right? fewer --passage-words?)"
        )
    rng.shuffle(reservoir)
    prompts = []
    for i in range(count):
        # a passage used again (more prompts than passages) gets the next template
        name = names[(i + i // len(reservoir)) % len(names)]
        content = PASSAGE_TEMPLATES[name].format(passage=reservoir[i % len(reservoir)])
        prompts.append(Prompt(messages=(("user", content),), kind=name))
    return prompts


def file_prompts(path: str | Path, count: int | None = None) -> list[Prompt]:
    """The prompts of a JSON-lines file (``prompt`` or ``messages`` per record, see
    speculant.prompt_records), cycled to `count` when given; BuildError when unusable."""
    try:
        prompts = load_prompts(path)
    except PromptsError as exc:
        raise BuildError(str(exc)) from exc
    if count is None:
        return prompts
    return [prompts[i % len(prompts)] for i in range(count)]


def write_prompts(path: str | Path, prompts: Sequence[Prompt]) -> None:
    """Write prompts as a prompts file (JSON lines: prompt or messages, kind, and the
    structured-output fields), which file_prompts reads back as they were; BuildError when it
    cannot be written."""
    lines = []
    for prompt in prompts:
        record: dict[str, Any] = (
            {"messages": prompt.message_dicts} if prompt.messages else {"prompt": prompt.text}
        )
        if prompt.kind:
            record["kind"] = prompt.kind
        record.update(prompt.structured_fields)
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    try:
        Path(path).write_text("".join(lines), encoding="utf-8")
    except OSError as exc:
        raise BuildError(f"cannot write prompts to {path}: {exc.strerror or exc}") from exc


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
