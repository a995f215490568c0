"""The named graphs one draft service drafts from (the embedded mode uses it too).

Terms (see also :mod:`speculant.graph_catalog`): each *name* has a slot holding the graph it
serves now (:mod:`draft_service.graph_slot`); every graph of the catalog was built with one
tokenizer (the first graph's: the verifier's, as the gateway checks). A graph being *replaced*
(a new folder under its name, or a rebuild published at its folder) or *removed* is not closed at
once: it *lingers* while requests that began on it still draft (ProposeRequest.graph_id names
the build a request began on) and closes once no call has used it for ``linger_s`` seconds, so
a request in flight finishes on the graph it began with. The name :data:`NO_GRAPH` is no graph:
drafts come from the request's own context (the overlay) only.

Changes made while serving (:meth:`GraphCatalog.add`, :meth:`GraphCatalog.remove`, the
AdminService) are recorded in the catalog file the replicas share;
:meth:`GraphCatalog.sync_file` applies what other replicas recorded there (the reload watcher
calls it, :mod:`draft_service.reload`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from draft_service.drafting import Drafter
from draft_service.graph_slot import STILL_OPENING, GraphSlot, LoadedGraph, load, using
from draft_service.learning import Learning, LearnOutcome
from speculant.errors import FailedPreconditionError, NotFoundError, UnavailableError
from speculant.graph_catalog import (
    NO_GRAPH,
    CatalogFile,
    CatalogFileError,
    GraphSpec,
    check_graph_name,
    check_tenant,
)
from speculant.graph_reader import NGramGraph, folder_bytes
from speculant.types import GraphStatus

log = logging.getLogger(__name__)

LINGER_S = 30.0  # a replaced or removed graph closes once unused this long


class EmptyGraph:
    """No graph (the name NO_GRAPH): every lookup is a dead end, so drafts come from the
    request's own context alone."""

    graph_id = NO_GRAPH
    path = Path(NO_GRAPH)
    indexed = False  # drafts take the Python path (draft_service.greedy_kernels reads an index)

    def __init__(self, max_order: int, vocab_size: int) -> None:
        self.draft_defaults: dict[str, object] = {}
        self.max_order = self.window = max_order
        self.vocab_size = vocab_size

    def match(self, tail: bytes, every_order: bool = True, top: int | None = None) -> tuple:
        return [], [], []

    def use_long_context(self, window: int) -> int:
        return self.window

    def damage(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class GraphCatalog:
    """Named graphs, changed while serving (see the module docstring). Thread-safe."""

    def __init__(
        self,
        learning: Learning | None = None,
        *,
        long_context: int = 0,
        linger_s: float = LINGER_S,
        catalog_file: CatalogFile | None = None,
    ) -> None:
        """learning: the learned layers (None: drafts from the graphs alone). catalog_file:
        where changes are recorded and read from (None: this process's changes are its own).
        """
        self.learning = learning
        self.long_context = long_context
        self.linger_s = linger_s
        self.catalog_file = catalog_file
        self.default_name = ""
        self.on_health: Callable[[bool], None] | None = None  # the default graph's health
        self._specs: list[GraphSpec] = []  # the flags' graphs
        self._slots: dict[str, GraphSlot] = {}
        self._paths: dict[str, Path] = {}
        self._lingering: dict[tuple[str, str], LoadedGraph] = {}  # (name, graph id) -> it
        self._lock = threading.RLock()
        self._change_lock = threading.Lock()  # one add or remove at a time
        self._fingerprint: tuple[str, str] | None = None  # (tokenizer name, fingerprint)
        self._none: LoadedGraph | None = None
        self._file_signature: tuple[int, int, int] | None = None

    # -- opening and changing -----------------------------------------------------------------

    def open(self, specs: Sequence[GraphSpec], default: str) -> None:
        """Serve the flags' graphs, with the catalog file's changes over them. A flag's graph
        that does not open, or of another tokenizer, is a GraphFormatError /
        FailedPreconditionError (nothing stays open); one the catalog file added is logged and
        left out."""
        self._specs = list(specs)
        self.default_name = default
        try:
            for spec in specs:
                self.add(spec.name, spec.path, persist=False)
            self.sync_file()
        except BaseException:
            self.close()
            raise

    def add(self, name: str, path: str | Path, *, persist: bool = True) -> tuple[LoadedGraph, bool]:
        """Serve the graph at path under name (replacing the one it served: True). The graph
        is opened and checked first: GraphFormatError, FailedPreconditionError (another
        tokenizer) or InvalidArgumentError (a bad name) leave the catalog unchanged; so does a
        catalog file that cannot be written (UnavailableError). persist: record the change in
        the catalog file."""
        check_graph_name(name, "name")
        graph = NGramGraph.open(Path(path).expanduser().absolute())
        return self.add_opened(name, graph, persist=persist)

    def add_opened(
        self, name: str, graph: NGramGraph, *, persist: bool = False
    ) -> tuple[LoadedGraph, bool]:
        """add() for a graph already open (closed again if it is refused)."""
        path = Path(graph.path).expanduser().absolute()
        with self._change_lock:
            try:
                check_graph_name(name, "name")
                self._check_tokenizer(graph)
                if persist and self.catalog_file is not None:
                    self.catalog_file.record_add(name, path)
                    self._note_own_write()
            except CatalogFileError as exc:
                graph.close()
                raise UnavailableError(f"{exc}: graph {name} not added") from exc
            except BaseException:
                graph.close()
                raise
            return self._install(name, path, graph)

    def remove(self, name: str, *, persist: bool = True) -> None:
        """Stop serving name (NotFoundError if unknown; FailedPreconditionError for the default
        graph). Requests that began on it finish on it (it lingers)."""
        with self._change_lock:
            if name == self.default_name:
                raise FailedPreconditionError(
                    f"{name!r} is the default graph: it cannot be removed (replace it instead, or "
                    "restart with another --default-graph)"
                )
            with self._lock:
                if name not in self._slots:
                    raise self._not_found(name)
            if persist and self.catalog_file is not None:
                try:
                    self.catalog_file.record_remove(name)
                except CatalogFileError as exc:
                    raise UnavailableError(str(exc)) from exc
                self._note_own_write()
            with self._lock:
                slot = self._slots.pop(name)
                del self._paths[name]
            slot.close()  # to the lingering graphs
            if self.learning is not None:
                self.learning.forget(name)
            log.info("graph %s removed", name)

    def install(self, name: str, graph: NGramGraph) -> LoadedGraph:
        """Serve an opened graph under a name already served (a rebuild published at its
        folder: see draft_service.reload); the caller checked its tokenizer."""
        return self._install(name, self._paths[name], graph)[0]

    def _install(self, name: str, path: Path, graph: NGramGraph) -> tuple[LoadedGraph, bool]:
        with self._lock:
            slot = self._slots.get(name)
            replaced = slot is not None
            if slot is None:
                slot = GraphSlot(
                    self._live_for(name),
                    long_context=self.long_context,
                    on_replaced=lambda old, name=name: self._linger(name, old),
                )
                if name == self.default_name:
                    slot.on_health = self.on_health
                self._slots[name] = slot
            self._paths[name] = path
        loaded = slot.install(graph)
        if self.learning is not None:  # replay the tenants' logs now, not on a Propose
            for tenant in self.learning.tenants_on_disk(name, graph):
                loaded.drafter_for(tenant)
        log.info(
            "graph %s %s: %s (version %d, %s tokens)",
            name,
            "replaced" if replaced else "serving",
            path,
            graph.meta.version,
            f"{graph.meta.corpus_tokens:,}",
        )
        return loaded, replaced

    def _live_for(self, name: str):
        learning = self.learning
        if learning is None:
            return None
        return lambda graph, tenant: learning.layer(name, tenant, graph)

    def _check_tokenizer(self, graph: NGramGraph) -> None:
        """FailedPreconditionError unless graph has the catalog's tokenizer (the first graph
        sets it)."""
        meta = graph.meta
        with self._lock:
            if self._fingerprint is None:
                self._fingerprint = (meta.tokenizer_name, meta.tokenizer_fingerprint)
                self._none = load(EmptyGraph(meta.max_order, meta.vocab_size), None)
                return
            name, fingerprint = self._fingerprint
        if meta.tokenizer_fingerprint != fingerprint:
            raise FailedPreconditionError(
                f"graph {graph.path} was built for the tokenizer {meta.tokenizer_name!r} "
                f"({meta.tokenizer_fingerprint[:23]}...), not the catalog's {name!r} "
                f"({fingerprint[:23]}...): rebuild it with `speculant build --tokenizer {name}`"
            )

    # -- the catalog file ---------------------------------------------------------------------

    def _note_own_write(self) -> None:
        """Our own write to the catalog file is applied already: no sync for it."""
        if self.catalog_file is not None:
            self._file_signature = self.catalog_file.signature()

    def sync_file(self) -> bool:
        """Apply the catalog file's changes if it changed since it was last read (True when a
        graph was added, replaced or removed). A graph that does not open is logged and left
        out."""
        catalog_file = self.catalog_file
        if catalog_file is None:
            return False
        found = catalog_file.signature()
        if found == self._file_signature:
            return False
        try:
            changes = catalog_file.read()
        except CatalogFileError as exc:
            log.error("%s; the catalog stays as it is", exc)
            self._file_signature = found
            return False
        self._file_signature = found
        wanted = changes.apply(self._specs)
        changed = False
        for name in [n for n in self.names() if n not in wanted]:
            with contextlib.suppress(NotFoundError):
                try:
                    self.remove(name, persist=False)
                    changed = True
                except FailedPreconditionError as exc:
                    log.error("catalog file %s: %s", catalog_file.path, exc)
        for name, path in wanted.items():
            path = path.expanduser().absolute()
            if self._paths.get(name) == path:
                continue
            try:
                self.add(name, path, persist=False)
                changed = True
            except Exception as exc:  # one bad entry never stops the others
                log.error("catalog file %s: graph %s not served: %s", catalog_file.path, name, exc)
        return changed

    # -- using --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def use(
        self, name: str = "", tenant: str = "", graph_id: str = ""
    ) -> Iterator[tuple[LoadedGraph, Drafter]]:
        """The loaded graph a call drafts from, and the tenant's drafter of it, kept open until
        the block ends: the build graph_id while it lingers, else the graph named (empty: the
        default). NotFoundError for an unknown name, UnavailableError before any graph."""
        check_tenant(tenant)
        name = name or self.default_name
        loaded = self._acquire(name, graph_id)
        slot = self._slots.get(name)
        with using(loaded, slot.damaged if slot is not None else None):
            yield loaded, loaded.drafter_for(tenant)

    def _acquire(self, name: str, graph_id: str) -> LoadedGraph:
        if name == NO_GRAPH:
            if self._none is None:
                raise UnavailableError(STILL_OPENING)
            self._none.acquire()
            return self._none
        with self._lock:
            if graph_id:
                pinned = self._lingering.get((name, graph_id))
                if pinned is not None and pinned.acquire():
                    return pinned
            slot = self._slots.get(name)
        if slot is None:
            if self._fingerprint is None:
                raise UnavailableError(STILL_OPENING)
            raise self._not_found(name)
        return slot.acquire_current()

    def _not_found(self, name: str) -> NotFoundError:
        return NotFoundError(
            f"graph {name!r} is not served (graphs: {', '.join(self.names()) or 'none yet'})"
        )

    def learn(
        self,
        name: str,
        tenant: str,
        token_ids: Sequence[int],
        generation_id: str,
        persist: bool,
    ) -> LearnOutcome | None:
        """Learn a finished generation into (graph, tenant)'s layer (None when learning is
        off); NotFoundError for a graph no longer served, InvalidArgumentError for a bad
        report."""
        check_tenant(tenant)
        name = name or self.default_name
        if self.learning is None or name == NO_GRAPH:
            return None
        with self.use(name) as (loaded, _):
            return self.learning.learn(
                name, tenant, loaded.graph, token_ids, generation_id, persist
            )

    # -- what is served -----------------------------------------------------------------------

    def names(self) -> list[str]:
        """The names served, the default first."""
        with self._lock:
            names = list(self._slots)
        return sorted(names, key=lambda n: (n != self.default_name, n))

    def path_of(self, name: str) -> Path | None:
        return self._paths.get(name)

    def current(self, name: str) -> LoadedGraph | None:
        """The loaded graph name serves now (None if none), without taking it."""
        slot = self._slots.get(name)
        return slot.current if slot is not None else None

    def loaded_graphs(self) -> list[LoadedGraph]:
        """Every open loaded graph: the current ones and the lingering ones."""
        with self._lock:
            current = [slot.current for slot in self._slots.values()]
            return [g for g in current if g is not None] + list(self._lingering.values())

    def status(self, name: str) -> GraphStatus:
        """What ListGraphs reports of one graph (NotFoundError if unknown)."""
        with self.use(name) as (loaded, _):
            graph = loaded.graph
            meta = graph.meta
            return GraphStatus(
                name=name,
                path=str(graph.path),
                is_default=name == self.default_name,
                tokens=meta.corpus_tokens,
                bytes=folder_bytes(graph.path),
                resident_bytes=graph.resident_bytes(),
                graph_version=meta.version,
                graph_id=graph.graph_id,
                max_order=meta.max_order,
                tokenizer_name=meta.tokenizer_name,
            )

    def statuses(self) -> list[GraphStatus]:
        out = []
        for name in self.names():
            with contextlib.suppress(NotFoundError):  # removed meanwhile
                out.append(self.status(name))
        return out

    # -- lingering and closing ----------------------------------------------------------------

    def _linger(self, name: str, loaded: LoadedGraph) -> None:
        """Keep a replaced or removed graph open for the requests that began on it."""
        if self.linger_s <= 0:
            loaded.retire()
            return
        with self._lock:
            old = self._lingering.pop((name, loaded.graph_id), None)
            self._lingering[(name, loaded.graph_id)] = loaded
        if old is not None and old is not loaded:
            old.retire()

    def expire(self, now: float | None = None) -> int:
        """Close the lingering graphs unused for linger_s seconds; returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [
                key
                for key, loaded in self._lingering.items()
                if loaded.users == 0 and now - loaded.last_used >= self.linger_s
            ]
            expired = [self._lingering.pop(key) for key in gone]
        for loaded in expired:
            loaded.retire()
        return len(expired)

    def close(self) -> None:
        """Close every graph (each once no call uses it)."""
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
            self._paths.clear()
            lingering = list(self._lingering.values())
            self._lingering.clear()
        self.linger_s = 0  # nothing lingers from here on
        for slot in slots:
            slot.on_replaced = None
            slot.close()
        for loaded in lingering:
            loaded.retire()
