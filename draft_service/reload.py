"""Hot reload: the draft service switches to a graph newly published at its path.

Terms: a graph's *file id* is the (device, inode) of its ``data.mdb``, found through the graph
path (following symlinks). Publishing a graph never rewrites a data file in place: ``speculant
build`` (also with ``--append``) swaps the whole directory by an atomic rename, and a deployment
that keeps versioned directories may flip a symlink (``ln -sfn graph.v2 graph.new && mv -T
graph.new graph``). Either way the path's file id changes, which is what the watcher looks for.

The watcher is a thread: every ``interval_s`` seconds (0: only when :meth:`GraphWatcher.trigger`
is called, e.g. on SIGHUP) it applies the catalog file's changes
(:meth:`~draft_service.catalog.GraphCatalog.sync_file`) and stats each graph's path. When the
file id differs from the served graph's, it opens the new graph (which checks its manifest),
refuses it unless its tokenizer fingerprint equals the served graph's (the gateway checked that
one against the verifier's tokenizer), and installs it under the graph's name
(:class:`~draft_service.catalog.GraphCatalog`): calls that start afterwards use it, requests in
flight finish on the old one, which closes once they are done. A refused or unreadable graph is
logged once and the old graph keeps serving; the watcher tries again when another graph is
published there, or on the next trigger().
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from draft_service.catalog import GraphCatalog
from speculant.config import DEFAULT_RELOAD_INTERVAL_S
from speculant.errors import SpeculantError
from speculant.graph_format import GraphMeta
from speculant.graph_manifest import DATA_FILE
from speculant.graph_reader import NGramGraph

log = logging.getLogger(__name__)

Signature = tuple[int, int, int]


def signature(path: Path) -> Signature | None:
    """(device, inode, mtime in ns) of path/data.mdb, or None when there is none (e.g. in the
    instant between the two renames of a publish without an atomic exchange)."""
    try:
        stat = os.stat(path / DATA_FILE)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns


def describe_change(old: GraphMeta, new: GraphMeta) -> str:
    """What a newly published graph changed, for the reload log line: its version (an append
    adds one; a rebuild from scratch keeps 1, so its build time says it is new), and each corpus
    figure or setting that differs."""
    if new.version != old.version:
        parts = [f"version {old.version} -> {new.version}"]
    else:
        parts = [f"rebuilt (version {new.version}, built {old.built_at} -> {new.built_at})"]
    for label, before, after in (
        ("documents", old.corpus_documents, new.corpus_documents),
        ("tokens", old.corpus_tokens, new.corpus_tokens),
    ):
        parts.append(
            f"{after:,} {label}" if before == after else f"{label} {before:,} -> {after:,}"
        )
    if new.max_order != old.max_order:
        parts.append(f"max order {old.max_order} -> {new.max_order}")
    else:
        parts.append(f"max order {new.max_order}")
    inputs = old.build_params.get("inputs"), new.build_params.get("inputs")
    if inputs[0] != inputs[1]:
        parts.append(f"inputs {inputs[0]} -> {inputs[1]}")
    if old.tuned.get("params") != new.tuned.get("params"):
        parts.append(f"tuned defaults {old.tuned.get('params')} -> {new.tuned.get('params')}")
    return ", ".join(parts)


class GraphWatcher:
    """Reloads a catalog's graphs when a new one is published at a graph's folder, and applies
    the catalog file's changes (see the module docstring)."""

    def __init__(
        self,
        catalog: GraphCatalog,
        interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
    ) -> None:
        if interval_s < 0:
            raise ValueError(f"the reload interval must be >= 0, got {interval_s}")
        self.catalog = catalog
        self.interval_s = interval_s
        self.reloads = 0  # graphs installed by this watcher
        self._refused: dict[str, Signature] = {}  # a graph already refused (logged once)
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._check_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="graph-reload", daemon=True)
        self._thread.start()

    def trigger(self) -> None:
        """Check now (from a signal handler too: it only sets an event), retrying a graph that
        was refused before."""
        self._refused.clear()
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.interval_s if self.interval_s > 0 else None)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                self.check()
            except Exception:  # never let the watcher die: the old graphs keep serving
                log.exception("graph reload failed")

    def check(self, retry: bool = False) -> bool:
        """Apply the catalog file's changes, then install each graph newly published at its
        folder; True when a graph was installed. retry: try again a graph refused before."""
        with self._check_lock:
            changed = self.catalog.sync_file()
            for name in self.catalog.names():
                changed = self._check_path(name, retry) or changed
        return changed

    def _check_path(self, name: str, retry: bool) -> bool:
        """Install the graph published at name's folder if it is a new one."""
        current = self.catalog.current(name)
        path = self.catalog.path_of(name)
        found = signature(path) if path is not None else None
        if found is None or current is None:
            return False
        if found[:2] == current.graph.file_id or (found == self._refused.get(name) and not retry):
            return False
        try:
            graph = NGramGraph.open(path)
        except (SpeculantError, OSError) as exc:
            self._refuse(name, path, found, f"cannot open it: {exc}")
            return False
        old = current.graph.meta
        if graph.meta.tokenizer_fingerprint != old.tokenizer_fingerprint:
            graph.close()
            self._refuse(
                name,
                path,
                found,
                f"its tokenizer {graph.meta.tokenizer_name!r} "
                f"({graph.meta.tokenizer_fingerprint[:23]}...) is not the served graph's "
                f"{old.tokenizer_name!r} ({old.tokenizer_fingerprint[:23]}...); restart the "
                "service (and the gateway) to change tokenizers",
            )
            return False
        try:
            self.catalog.install(name, graph)
        except KeyError:  # removed meanwhile
            graph.close()
            return False
        self._refused.pop(name, None)
        self.reloads += 1
        log.info("reloaded graph %s: %s", path, describe_change(old, graph.meta))
        return True

    def _refuse(self, name: str, path: Path, found: Signature, why: str) -> None:
        self._refused[name] = found
        log.error(
            "not reloading the graph published at %s: %s; still serving the old one", path, why
        )
