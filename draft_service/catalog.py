"""The named graphs one draft service drafts from (the embedded mode uses it too).

Terms (see also :mod:`speculant.graph_catalog`): each *name* has a slot holding the graph it
serves now (*slots* below); every graph of the catalog was built with one
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

**Slots**: the graph a name serves, replaceable while calls are running.

Terms: a *loaded graph* is an opened graph with its drafters, one per tenant that drafted from
it (each holds that tenant's learned layer and step caches, which belong to that graph alone).
The *slot* holds the current one. A call takes it with :meth:`GraphSlot.use` and answers wholly
from it; :meth:`GraphSlot.install` makes a new one current for the calls that start afterwards
(a reference swap under a lock). The graph it replaces is *retired*: closed when the last call
using it ends (reference counts), so a call in flight never sees a closed graph and never mixes
two graphs. (The catalog may keep a replaced graph open a while longer instead, for the requests
that began on it: ``on_replaced``, the lingering above.)

A *damaged* graph is one whose mapped data file shrank or changed while served
(:mod:`speculant.graph_format`): checked before and after every call, it answers nothing more
(GraphDamagedError, UNAVAILABLE) until another graph is installed; ``on_health`` hears False
when the current graph is found damaged, True when a graph is installed.

Why so long: the catalog is the set of its names' slots, and each slot's swap, retirement and
damage checks are what the catalog's replace, linger and remove are made of: one job, the
graphs a draft service serves, whose halves share their locks' and reference counts' rules.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from draft_service.drafting import Drafter
from draft_service.learning import Learning, LearnOutcome, LiveLayer
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


STILL_OPENING = "the draft service is still opening its graph"  # UNAVAILABLE before a graph
# Per loaded graph, the drafters of named tenants kept (the least recently used one's caches go
# first; its learned layer stays), each with step caches of TENANT_CACHE_SIZE steps: what the
# caches of many tenants may cost in memory stays bounded (docs/benchmarks.md).
MAX_TENANT_DRAFTERS = 16
TENANT_CACHE_SIZE = 2048

# (graph, tenant) -> that tenant's learned layer of the graph (None: drafts from the graph alone)
LiveFor = Callable[[NGramGraph, str], LiveLayer | None]


class GraphDamagedError(UnavailableError):
    """The served graph's data file was damaged while mapped: no answer comes from it."""


@dataclass(eq=False)
class LoadedGraph:
    """An opened graph, its drafters by tenant, and how many calls use it now."""

    graph: NGramGraph
    drafter: Drafter  # the default tenant's
    live_for: LiveFor | None = None  # None: every tenant drafts from the graph alone
    tenants: OrderedDict[str, Drafter] = field(default_factory=OrderedDict)
    users: int = 0
    retired: bool = False
    damaged: bool = False
    last_used: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def graph_id(self) -> str:
        return self.graph.graph_id

    def drafter_for(self, tenant: str) -> Drafter:
        """The tenant's drafter (made on its first call; "" is the default tenant's)."""
        if not tenant or self.live_for is None:
            return self.drafter
        with self._lock:
            drafter = self.tenants.get(tenant)
            if drafter is not None:
                self.tenants.move_to_end(tenant)
                return drafter
        live = self.live_for(self.graph, tenant)
        drafter = Drafter(self.graph, live=live, cache_size=TENANT_CACHE_SIZE)
        with self._lock:
            drafter = self.tenants.setdefault(tenant, drafter)
            while len(self.tenants) > MAX_TENANT_DRAFTERS:
                self.tenants.popitem(last=False)  # its layer stays with the learning
        return drafter

    def acquire(self) -> bool:
        """Count one more call using it (False once it is closed)."""
        with self._lock:
            if self.retired and self.users == 0:
                return False
            self.users += 1
            return True

    def release(self) -> None:
        """One call ended: close a retired graph that no call uses any more."""
        with self._lock:
            self.users -= 1
            self.last_used = time.monotonic()
            close = self.retired and self.users == 0
        if close:
            self.graph.close()

    def retire(self) -> None:
        """Close it now, or when its last call ends."""
        with self._lock:
            if self.retired:
                return
            self.retired = True
            close = self.users == 0
        if close:
            self.graph.close()


def load(graph: NGramGraph, live_for: LiveFor | None, long_context: int = 0) -> LoadedGraph:
    """graph with a default tenant's drafter (live_for: the tenants' learned layers)."""
    graph.use_long_context(long_context)
    live = live_for(graph, "") if live_for is not None else None
    return LoadedGraph(graph, Drafter(graph, live=live), live_for)


class GraphSlot:
    """Holds the current loaded graph; swaps it atomically (see the module docstring).

    live_for: the learned layer of a (graph, tenant) (``Learning.layer`` bound to the graph's
    name), or None for drafts from the graph alone. on_health: told False when the current
    graph is found damaged, True when a graph is installed. on_replaced: takes the loaded
    graph that an install replaces (and retires it in its time); None: retired at once."""

    def __init__(
        self,
        live_for: LiveFor | None = None,
        on_health: Callable[[bool], None] | None = None,
        long_context: int = 0,
        on_replaced: Callable[[LoadedGraph], None] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.long_context = long_context  # each graph installed drafts with it (graph_reader)
        self._current: LoadedGraph | None = None
        self._live_for = live_for
        self.on_health = on_health
        self.on_replaced = on_replaced

    @property
    def current(self) -> LoadedGraph | None:
        """The current loaded graph (None before the first install), without taking it."""
        return self._current

    @contextlib.contextmanager
    def use(self) -> Iterator[LoadedGraph]:
        """The current loaded graph, kept open until the block ends (UnavailableError if none)."""
        with using(self.acquire_current(), self.damaged) as loaded:
            yield loaded

    def acquire_current(self) -> LoadedGraph:
        """The current loaded graph, acquired (release it; UnavailableError if none)."""
        with self._lock:
            loaded = self._current
            if loaded is None:
                raise UnavailableError(STILL_OPENING)
            loaded.acquire()  # the current graph is never retired
        return loaded

    def damaged(self, loaded: LoadedGraph, reason: str) -> None:
        """A damaged graph was found: tell on_health when it is the current one."""
        if loaded is self._current and self.on_health is not None:
            self.on_health(False)

    def install(self, graph: NGramGraph) -> LoadedGraph:
        """Make graph (with a new Drafter of it) the current one; the one it replaces closes
        once no call uses it (or goes to on_replaced)."""
        loaded = load(graph, self._live_for, self.long_context)
        with self._lock:
            old, self._current = self._current, loaded
        if old is not None:
            if self.on_replaced is not None:
                self.on_replaced(old)
            else:
                old.retire()
        if self.on_health is not None:
            self.on_health(True)
        return loaded

    def close(self) -> LoadedGraph | None:
        """Take the current graph out (retired now, or when its last call ends; or handed to
        on_replaced); returns it."""
        with self._lock:
            old, self._current = self._current, None
        if old is not None:
            if self.on_replaced is not None:
                self.on_replaced(old)
            else:
                old.retire()
        return old


@contextlib.contextmanager
def using(
    loaded: LoadedGraph, on_damage: Callable[[LoadedGraph, str], None] | None = None
) -> Iterator[LoadedGraph]:
    """The block's use of an acquired loaded graph, checked for damage before and after (and
    released at its end)."""
    try:
        check(loaded, on_damage)
        try:
            yield loaded
        except Exception:
            check(loaded, on_damage)  # an error from reading a damaged map: say that instead
            raise
        check(loaded, on_damage)  # a read that hit the truncated end read zeros: no answer
    finally:
        loaded.release()


def check(loaded: LoadedGraph, on_damage: Callable[[LoadedGraph, str], None] | None = None) -> None:
    """GraphDamagedError when the graph's data file is damaged (logged once)."""
    reason = loaded.graph.damage()
    if reason is None:
        return
    with loaded._lock:
        first = not loaded.damaged
        loaded.damaged = True
    if first:
        log.error(
            "graph %s is damaged: %s; answering UNAVAILABLE until a good graph is published there",
            loaded.graph.path,
            reason,
        )
        if on_damage is not None:
            on_damage(loaded, reason)
    raise GraphDamagedError(
        f"the draft service's graph {loaded.graph.path} is damaged ({reason}); "
        "publish a good graph there (it is loaded without a restart)"
    )


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
