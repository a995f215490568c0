"""The graph a name serves, replaceable while calls are running.

Terms: a *loaded graph* is an opened graph with its drafters, one per tenant that drafted from
it (each holds that tenant's learned layer and step caches, which belong to that graph alone).
The *slot* holds the current one. A call takes it with :meth:`GraphSlot.use` and answers wholly
from it; :meth:`GraphSlot.install` makes a new one current for the calls that start afterwards
(a reference swap under a lock). The graph it replaces is *retired*: closed when the last call
using it ends (reference counts), so a call in flight never sees a closed graph and never mixes
two graphs. (A catalog may keep a replaced graph open a while longer instead, for the requests
that began on it: ``on_replaced``, see :mod:`draft_service.catalog`.)

A *damaged* graph is one whose mapped data file shrank or changed while served
(:mod:`speculant.map_guard`): checked before and after every call, it answers nothing more
(GraphDamagedError, UNAVAILABLE) until another graph is installed; ``on_health`` hears False
when the current graph is found damaged, True when a graph is installed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from draft_service.drafting import Drafter
from draft_service.live_layer import LiveLayer
from speculant.errors import UnavailableError
from speculant.graph_reader import NGramGraph

STILL_OPENING = "the draft service is still opening its graph"  # UNAVAILABLE before a graph
# Per loaded graph, the drafters of named tenants kept (the least recently used one's caches go
# first; its learned layer stays), each with step caches of TENANT_CACHE_SIZE steps: what the
# caches of many tenants may cost in memory stays bounded (docs/benchmarks.md).
MAX_TENANT_DRAFTERS = 16
TENANT_CACHE_SIZE = 2048

log = logging.getLogger(__name__)

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
