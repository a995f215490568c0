"""The files and modules that docstrings, comments and proto comments cite exist: a module moved
or merged leaves no reader following a path that is gone.

Checked: every ``dir/name.ext`` path (.py, .md, .proto, .sh, .toml, .json, .jsonl, .txt) in the
docstrings and comments of the production packages and scripts, and in the protos' comments,
exists from the repository root, from the citing file's folder or from its package; and every
dotted name ``package.module[.attribute...]`` of a project package resolves to a module and its
attributes. Not checked: placeholders (a path starting with a capitalised word such as
``OUT/`` or ``GRAPH_DIR/``), ``../shared/`` assets (tests/assets.py), the protobuf names under
``speculant.v1`` (their services and messages), a ``.proto``/``.py``/``.md`` file named with
dots, and ``speculant.<field>`` of the HTTP extension object (gateway/api/bodies.py).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

from gateway.api.bodies import SpeculantOptions
from speculant.v1 import common_pb2

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "bench",
    "builder",
    "distill",
    "draft_service",
    "gateway",
    "launcher",
    "speculant",
    "verifier_service",
)
PATH = re.compile(
    r"(?<![\w./-])((?:\.\./)?(?:[A-Za-z_][\w-]*/)+[\w-]+\.(?:py|md|proto|sh|toml|jsonl|json|txt))\b"
)
DOTTED = re.compile(rf"(?<![\w./])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")
FILE_SUFFIXES = {"py", "md", "proto", "sh", "toml", "json", "jsonl", "txt"}
# the HTTP extension object: its own fields and the DraftOptions fields it passes on
HTTP_FIELDS = {
    f"speculant.{name}"
    for name in (*SpeculantOptions.model_fields, *common_pb2.DraftOptions.DESCRIPTOR.fields_by_name)
}


def _cited_texts(path: Path) -> Iterator[str]:
    """The docstrings and comments of a Python file, or the comments of a proto."""
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".proto":
        yield from re.findall(r"//[^\n]*", source)
        return
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield docstring
    yield from (line[line.index("#") :] for line in source.splitlines() if "#" in line)


def _sources() -> list[Path]:
    python = [
        path
        for folder in (*PACKAGES, "scripts")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "_pb2" not in path.name
    ]
    return python + sorted((ROOT / "protos").rglob("*.proto"))


def _path_exists(cited: str, source: Path) -> bool:
    if cited.startswith("../shared/") or cited.split("/")[0][:1].isupper():
        return True
    package = ROOT / source.relative_to(ROOT).parts[0]
    return any((base / cited).exists() for base in (ROOT, source.parent, package))


def _name_resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    if dotted in HTTP_FIELDS or parts[:2] == ["speculant", "v1"] or parts[-1] in FILE_SUFFIXES:
        return True
    for length in range(len(parts), 0, -1):
        module_name = ".".join(parts[:length])
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ImportError:
            found = False
        if found:
            target: object = importlib.import_module(module_name)
            for attribute in parts[length:]:
                if not hasattr(target, attribute):
                    return False
                target = getattr(target, attribute)
            return True
    return False


def test_every_cited_path_and_module_exists() -> None:
    missing = []
    for source in _sources():
        where = source.relative_to(ROOT)
        for text in _cited_texts(source):
            missing += [f"{where}: {p}" for p in PATH.findall(text) if not _path_exists(p, source)]
            missing += [f"{where}: {n}" for n in DOTTED.findall(text) if not _name_resolves(n)]
    assert not missing, "cited but not found:\n" + "\n".join(sorted(set(missing)))


def test_a_moved_module_is_caught() -> None:
    """The checks can fail: a path and a module that are gone are reported."""
    assert not _path_exists("speculant/map_guard.py", ROOT / "speculant" / "config.py")
    assert not _name_resolves("speculant.map_guard")
    assert not _name_resolves("speculant.config.NoSuchName")
    assert _name_resolves("speculant.config.DraftParams")
