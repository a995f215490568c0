"""Corpora and reference graphs of the build tests: small slices of the tinystories corpus (2
files, from the demo kit) and of python source (1 file, from ../shared/corpus/python), and the
one-process, one-partition builds of them that the other engines and partitionings must equal.
"""

from __future__ import annotations

from pathlib import Path

from builder import GraphBuilder
from tests.assets import (
    GPT2_TOKENIZER,
    PYTHON_CORPUS,
    STORIES_MODEL,
    STORY_SEPARATOR,
    TINYSTORIES_CORPUS,
    needs,
)

STORIES = str(STORIES_MODEL)
PY_SEPARATOR = " ===== file: "  # both files of ../shared/corpus/python start a file with it


def build(out: Path, files: list[Path], tokenizer: str, sep: str | None, **kw) -> object:
    b = GraphBuilder(tokenizer_name=tokenizer, max_order=kw.pop("max_order", 4), **kw)
    with b:
        b.build_from_files([str(f) for f in files], doc_separator=sep)
        return b.save(out)


class Slices:
    """Small corpus slices, written on first use: tinystories (2 files, from the demo kit) and
    python source (1 file, from ../shared/corpus/python: tests using it are marked)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.made: dict[str, list[Path]] = {}

    def __getitem__(self, name: str) -> list[Path]:
        if name not in self.made:
            self.made[name] = self._stories() if name == "stories" else self._python()
        return self.made[name]

    def _stories(self) -> list[Path]:
        d = self.directory
        text = TINYSTORIES_CORPUS.read_text(encoding="utf-8")[:600_000]
        stories = text.split(STORY_SEPARATOR)[:-1]
        (d / "s1.txt").write_text(STORY_SEPARATOR.join(stories[:700]), encoding="utf-8")
        (d / "s2.txt").write_text(STORY_SEPARATOR.join(stories[700:]), encoding="utf-8")
        return [d / "s1.txt", d / "s2.txt"]

    def _python(self) -> list[Path]:
        with (PYTHON_CORPUS / "stdlib.py.txt").open(encoding="utf-8") as f:
            code = f.read(1_500_000)
        path = self.directory / "py.txt"
        path.write_text(code[: code.rindex(PY_SEPARATOR)], encoding="utf-8")
        return [path]


# The python slice is tokenized with gpt-2: both come from ../shared.
needs_python = needs(PYTHON_CORPUS, GPT2_TOKENIZER)


class References:
    """The one-process, one-partition builds the other engines must equal, built on first use."""

    def __init__(self, slices: Slices, directory: Path) -> None:
        self.slices = slices
        self.directory = directory
        self.built: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.built:
            out = self.directory / name
            if name == "stories":
                build(out, self.slices[name], STORIES, STORY_SEPARATOR, workers=1)
            else:
                build(out, self.slices[name], str(GPT2_TOKENIZER), PY_SEPARATOR, workers=1)
            self.built[name] = out
        return self.built[name]
