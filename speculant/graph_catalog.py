"""The graph catalog's records: graph and tenant names, the ``--graph NAME=PATH`` flags, and the
catalog file that a draft tier's replicas share.

Terms. A *catalog* maps names to graph folders, all built with one tokenizer (the verifier's).
A request names the graph it drafts from (``GenerateRequest.graph``, ``ProposeRequest.graph``;
empty: the *default graph*; :data:`NO_GRAPH`: no graph at all, drafts from the request's own
context only). A *tenant* is the name bound to a client's token (:mod:`speculant.auth`); what
the draft tier learns from a generation goes into that (graph, tenant)'s learned layer alone.
Names and tenants are 1-64 characters of ``A-Z a-z 0-9 _ -`` starting with a letter or a digit
(no dots and no colons: a learn log's file name and an HTTP model id ``<model>:<graph>`` hold
them); the empty tenant is the default one.

The *catalog file* (JSON, no pickle) records the changes made while serving (``AdminService``):
graphs added or replaced (name -> folder) and names removed. A draft service applies it over
the graphs of its flags when it starts and whenever the file changes, so every replica that
shares the file, one started later included, serves the same catalog. It is written whole (a
new file renamed over the old) under an exclusive ``flock`` of ``FILE.lock``, so replicas on one
host (or on a filesystem whose ``flock`` works) can share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speculant.errors import InvalidArgumentError

NO_GRAPH = "none"  # the graph name that asks for no graph
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
CATALOG_SUFFIX = ".catalog.json"  # the default catalog file: DEFAULT_GRAPH_DIR + this
FORMAT_NAME = "speculant-graph-catalog"
FORMAT_VERSION = 1


def check_graph_name(name: str, field_name: str = "graph") -> str:
    """name, or InvalidArgumentError naming field_name unless it is a valid graph name."""
    if name == NO_GRAPH:
        raise InvalidArgumentError(field_name, f'"{NO_GRAPH}" is reserved: it asks for no graph')
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidArgumentError(
            field_name,
            f"{name[:80]!r} is not a graph name (1-64 characters of A-Z a-z 0-9 _ -, starting "
            "with a letter or a digit)",
        )
    return name


def check_tenant(tenant: str, field_name: str = "tenant") -> str:
    """tenant ("" = the default tenant), or InvalidArgumentError naming field_name."""
    if tenant and not NAME_PATTERN.fullmatch(tenant):
        raise InvalidArgumentError(
            field_name,
            f"{tenant[:80]!r} is not a tenant name (1-64 characters of A-Z a-z 0-9 _ -, "
            "starting with a letter or a digit)",
        )
    return tenant


@dataclass(frozen=True)
class GraphSpec:
    """One graph of a catalog: its name and folder."""

    name: str
    path: Path


def parse_graph_specs(
    values: Sequence[str], default: str | None = None
) -> tuple[list[GraphSpec], str]:
    """The graphs of repeated ``--graph NAME=PATH`` flags (a bare PATH is one graph named after
    its folder) and the default graph's name (``--default-graph``, else the first one);
    InvalidArgumentError naming the flag for a bad name, a name given twice or an unknown
    default."""
    specs: list[GraphSpec] = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or "/" in name:  # a bare path (a folder's name may hold "=")
            name, path = graph_name_of(value), value
        if not path:
            raise InvalidArgumentError("--graph", f"{value!r} names no folder (NAME=PATH)")
        check_graph_name(name, "--graph")
        if any(spec.name == name for spec in specs):
            raise InvalidArgumentError("--graph", f"the name {name!r} is given twice")
        specs.append(GraphSpec(name, Path(path)))
    if not specs:
        raise InvalidArgumentError("--graph", "give at least one graph folder")
    chosen = default or specs[0].name
    if all(spec.name != chosen for spec in specs):
        raise InvalidArgumentError(
            "--default-graph", f"{chosen!r} is none of the graphs given ({spec_names(specs)})"
        )
    return specs, chosen


def graph_name_of(path: str | Path) -> str:
    """The name a bare graph folder is served under: its folder's name, with the characters a
    name cannot hold turned into '-' (InvalidArgumentError naming --graph if none is left)."""
    folder = Path(path).expanduser().absolute().name
    name = re.sub(r"[^A-Za-z0-9_-]", "-", folder).lstrip("_-")[:64]
    if not name:
        raise InvalidArgumentError(
            "--graph", f"cannot name the graph {str(path)!r} after its folder: use NAME=PATH"
        )
    return name


def spec_names(specs: Sequence[GraphSpec]) -> str:
    return ", ".join(spec.name for spec in specs)


def default_catalog_path(default_graph: str | Path) -> Path:
    """The catalog file's default place: beside the default graph (as its learn log)."""
    path = Path(default_graph).expanduser().absolute()
    return path.with_name(path.name + CATALOG_SUFFIX)


@dataclass
class CatalogChanges:
    """What was changed while serving: graphs added or replaced, names removed."""

    added: dict[str, str] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)

    def apply(self, specs: Sequence[GraphSpec]) -> dict[str, Path]:
        """The catalog: the flags' graphs, less the removed names, plus the added graphs."""
        graphs = {spec.name: spec.path for spec in specs if spec.name not in self.removed}
        graphs.update((name, Path(path)) for name, path in self.added.items())
        return graphs


class CatalogFileError(Exception):
    """The catalog file cannot be read or written: the message says why."""


class CatalogFile:
    """The catalog file at path (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def signature(self) -> tuple[int, int, int] | None:
        """(device, inode, mtime in ns) of the file, or None while there is none."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_dev, stat.st_ino, stat.st_mtime_ns

    def read(self) -> CatalogChanges:
        """The changes recorded (none while there is no file); CatalogFileError if unreadable."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return CatalogChanges()
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogFileError(f"cannot read the catalog file {self.path}: {exc}") from exc
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT_NAME or data.get("version") != FORMAT_VERSION:
                raise ValueError(f"not a {FORMAT_NAME} version {FORMAT_VERSION} file")
            added = {check_graph_name(str(k)): str(v) for k, v in data["added"].items()}
            removed = {check_graph_name(str(name)) for name in data["removed"]}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CatalogFileError(f"corrupt catalog file {self.path}: {exc}") from exc
        return CatalogChanges(added, removed)

    def record_add(self, name: str, path: str | Path) -> None:
        """Record that name now serves the graph at path (CatalogFileError if not written)."""
        with self._changing() as changes:
            changes.removed.discard(name)
            changes.added[name] = str(Path(path).expanduser().absolute())

    def record_remove(self, name: str) -> None:
        """Record that name is no longer served (CatalogFileError if not written)."""
        with self._changing() as changes:
            changes.added.pop(name, None)
            changes.removed.add(name)

    @contextlib.contextmanager
    def _changing(self) -> Iterator[CatalogChanges]:
        """The recorded changes, to change in the block, then written (under the lock)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise CatalogFileError(f"cannot write the catalog file {self.path}: {exc}") from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            changes = self.read()
            yield changes
            body = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "added": dict(sorted(changes.added.items())),
                "removed": sorted(changes.removed),
            }
            tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
            try:
                with tmp.open("w", encoding="utf-8") as out:
                    out.write(json.dumps(body, indent=2) + "\n")
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.path)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise CatalogFileError(f"cannot write the catalog file {self.path}: {exc}") from exc
        finally:
            os.close(lock)  # releases the lock
