"""The graph a draft service answers from, replaceable while calls are running.

Terms: a *loaded graph* is an opened graph with its Drafter (whose step caches belong to that
graph alone). The *slot* holds the current one. A call takes it with :meth:`GraphSlot.use` and
answers wholly from it; :meth:`GraphSlot.install` makes a new one current for the calls that
start afterwards (a reference swap under a lock). The graph it replaces is *retired*: closed
when the last call using it ends (reference counts), so a call in flight never sees a closed
graph and never mixes two graphs.

A *damaged* graph is one whose mapped data file shrank or changed while served
(:mod:`speculant.map_guard`): checked before and after every call, it answers nothing more
(GraphDamagedError, UNAVAILABLE) until another graph is installed; ``on_health`` hears False
when the current graph is found damaged, True when a graph is installed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from draft_service.drafting import Drafter
from draft_service.live_layer import LiveLayer
from speculant.errors import UnavailableError
from speculant.graph_reader import NGramGraph

STILL_OPENING = "the draft service is still opening its graph"  # UNAVAILABLE before a graph

log = logging.getLogger(__name__)


class GraphDamagedError(UnavailableError):
    """The served graph's data file was damaged while mapped: no answer comes from it."""


@dataclass(eq=False)
class LoadedGraph:
    """An opened graph, its drafter, and how many calls use it now."""

    graph: NGramGraph
    drafter: Drafter
    users: int = 0
    retired: bool = False
    damaged: bool = False


class GraphSlot:
    """Holds the current loaded graph; swaps it atomically (see the module docstring).

    live_for: the live layer a new graph's drafter combines with it (``Learning.attach``), or
    None for drafts from the graph alone. on_health: told False when the current graph is found
    damaged, True when a graph is installed."""

    def __init__(
        self,
        live_for: Callable[[NGramGraph], LiveLayer] | None = None,
        on_health: Callable[[bool], None] | None = None,
        long_context: int = 0,
    ) -> None:
        self._lock = threading.Lock()
        self.long_context = long_context  # each graph installed drafts with it (graph_reader)
        self._current: LoadedGraph | None = None
        self._live_for = live_for
        self.on_health = on_health

    @property
    def current(self) -> LoadedGraph | None:
        """The current loaded graph (None before the first install), without taking it."""
        return self._current

    @contextlib.contextmanager
    def use(self) -> Iterator[LoadedGraph]:
        """The current loaded graph, kept open until the block ends (UnavailableError if none)."""
        with self._lock:
            loaded = self._current
            if loaded is None:
                raise UnavailableError(STILL_OPENING)
            loaded.users += 1
        try:
            self._check(loaded)
            try:
                yield loaded
            except Exception:
                self._check(loaded)  # an error from reading a damaged map: say that instead
                raise
            self._check(loaded)  # a read that hit the truncated end read zeros: no answer
        finally:
            with self._lock:
                loaded.users -= 1
                close = loaded.retired and loaded.users == 0
            if close:
                loaded.graph.close()

    def install(self, graph: NGramGraph) -> LoadedGraph:
        """Make graph (with a new Drafter of it) the current one; the one it replaces closes
        once no call uses it."""
        live = self._live_for(graph) if self._live_for is not None else None
        graph.use_long_context(self.long_context)
        loaded = LoadedGraph(graph, Drafter(graph, live=live))
        with self._lock:
            old, self._current = self._current, loaded
        self._retire(old)
        if self.on_health is not None:
            self.on_health(True)
        return loaded

    def _check(self, loaded: LoadedGraph) -> None:
        """GraphDamagedError when the graph's data file is damaged (logged once)."""
        reason = loaded.graph.damage()
        if reason is None:
            return
        with self._lock:
            first = not loaded.damaged
            loaded.damaged = True
            current = loaded is self._current
        if first:
            log.error(
                "graph %s is damaged: %s; answering UNAVAILABLE until a good graph is "
                "published there",
                loaded.graph.path,
                reason,
            )
            if current and self.on_health is not None:
                self.on_health(False)
        raise GraphDamagedError(
            f"the draft service's graph {loaded.graph.path} is damaged ({reason}); "
            "publish a good graph there (it is loaded without a restart)"
        )

    def replace_drafter(self, drafter: Drafter) -> None:
        """Answer from the current graph with another drafter (e.g. a wrapper in tests)."""
        with self._lock:
            if self._current is None:
                raise UnavailableError(STILL_OPENING)
            self._current.drafter = drafter

    def close(self) -> None:
        """Retire the current graph (closed now, or when its last call ends)."""
        with self._lock:
            old, self._current = self._current, None
        self._retire(old)

    def _retire(self, loaded: LoadedGraph | None) -> None:
        if loaded is None:
            return
        with self._lock:
            loaded.retired = True
            close = loaded.users == 0
        if close:
            loaded.graph.close()
