"""The draft service's server: speculant.v1.DraftService (and AdminService) over gRPC, and its
lifecycle.

DraftServer binds (health NOT_SERVING), opens its graphs (then SERVING), watches the graph
paths and the catalog file for changes to load without a restart (:mod:`draft_service.reload`),
unmaps touched graph pages and closes the graphs that linger unused, periodically, and stops.
The requests themselves are answered by the servicers (:mod:`draft_service.servicer`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draft_service.catalog import LINGER_S, STILL_OPENING
from draft_service.learning import Learning, LearningConfig
from draft_service.metrics import DraftMetrics
from draft_service.reload import DEFAULT_RELOAD_INTERVAL_S, GraphWatcher
from draft_service.servicer import AdminServicer, DraftServicer
from speculant.config import DEFAULT_MAX_CONTEXT_TOKENS, DraftParams
from speculant.errors import InvalidArgumentError, UnavailableError
from speculant.graph_catalog import CatalogFile, GraphSpec, parse_graph_specs
from speculant.graph_reader import NGramGraph
from speculant.grpc_server import RESERVED_THREADS, ServiceServer
from speculant.metrics import Metrics
from speculant.suffix_index import MAX_CONTEXT
from speculant.tls import ServerTls
from speculant.v1 import admin_pb2, admin_pb2_grpc, draft_pb2, draft_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name
ADMIN_SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name
# How often the server unmaps the graph pages it touched (see NGramGraph.release_pages): after
# an interval without drafts, and at least every BUSY_RELEASE_S while it drafts. (Unmapping while
# drafts run makes the next ones fault their pages back in, and the kernel interrupts the other
# cores to flush their TLBs: rounds slowed every half second.)
RELEASE_INTERVAL_S = 0.5
BUSY_RELEASE_S = 30.0
DEFAULT_LEARNING = LearningConfig()  # learning is on unless a caller passes None


class DraftServer:
    """A running draft service: gRPC server (health, reflection) + servicer + graph.

    start() binds and answers health NOT_SERVING; load_graph() opens the graph, switches health
    to SERVING and starts watching the graph path: a graph newly published there is loaded
    without a restart (every ``reload_interval_s`` seconds, 0 = only on request_reload(); see
    :mod:`draft_service.reload`); stop() shuts down and closes the graph.

    Threads: ``workers`` open ProposeStreams are served at once (one thread each, while open);
    the server runs RESERVED_THREADS more for health checks, GetGraphInfo and unary Propose, so
    that no number of streams, idle or busy, leaves those unanswered.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 50051,
        *,
        workers: int = 8,
        defaults: DraftParams | None = None,
        release_interval_s: float = RELEASE_INTERVAL_S,
        tls: ServerTls | None = None,
        reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
        metrics: Metrics | None = None,
        learning: LearningConfig | None = DEFAULT_LEARNING,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        long_context: int = 0,
        catalog_file: str | Path | None = None,
        admin_token: str | None = None,
        linger_s: float = LINGER_S,
    ) -> None:
        """metrics: count calls and drafts in it (its /metrics endpoint is the caller's).
        learning: learn from reported generations (draft_service.learning); None: off.
        max_context_tokens: longer Propose contexts are refused (INVALID_ARGUMENT).
        long_context: draft from the longest match of up to this many tokens (0: off; see
        NGramGraph.use_long_context). catalog_file: where catalog changes are recorded and
        read from (speculant.graph_catalog; None: this service's changes are its own).
        admin_token: the token AdminService calls need (None: refused). linger_s: how long a
        replaced or removed graph stays open unused (draft_service.catalog)."""
        if reload_interval_s < 0:
            raise InvalidArgumentError(
                "reload_interval_s", f"must be >= 0, got {reload_interval_s}"
            )
        if max_context_tokens < 1:
            raise InvalidArgumentError(
                "max_context_tokens", f"must be >= 1, got {max_context_tokens}"
            )
        if not 0 <= long_context <= MAX_CONTEXT:
            raise InvalidArgumentError(
                "--long-context", f"must be in 0..{MAX_CONTEXT}, got {long_context}"
            )
        self.metrics = None if metrics is None else DraftMetrics(metrics.registry)
        self.servicer = DraftServicer(
            defaults,
            self.metrics,
            Learning(learning) if learning is not None else None,
            max_streams=workers,
            max_context_tokens=max_context_tokens,
            long_context=long_context,
            catalog_file=None if catalog_file is None else CatalogFile(catalog_file),
        )
        self.catalog = self.servicer.catalog
        self.catalog.linger_s = linger_s
        self.server = ServiceServer(
            host,
            port,
            [SERVICE_NAME, ADMIN_SERVICE_NAME],
            max_workers=workers + RESERVED_THREADS,
            tls=tls,
            metrics=metrics,
            admin_token=admin_token,
        )
        draft_pb2_grpc.add_DraftServiceServicer_to_server(self.servicer, self.server.grpc_server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.catalog), self.server.grpc_server
        )
        # a damaged default graph turns health NOT_SERVING, the next one installed SERVING again
        self.catalog.on_health = self.server.set_serving
        self._stopped = threading.Event()
        self.release_interval_s = release_interval_s
        self.reload_interval_s = reload_interval_s
        self._releaser: threading.Thread | None = None
        self.watcher: GraphWatcher | None = None

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> None:
        self.server.start()

    def load_graph(self, graph_path: str | Path) -> NGramGraph:
        """Serve one graph (named after its folder): see load_graphs."""
        specs, default = parse_graph_specs([str(graph_path)])
        self.load_graphs(specs, default)
        graph = self.servicer.graph
        assert graph is not None
        return graph

    def load_graphs(self, specs: Sequence[GraphSpec], default: str) -> None:
        """Open the graphs (GraphFormatError, FailedPreconditionError for a bad one or one of
        another tokenizer), then report SERVING and watch their paths and the catalog file."""
        self.servicer.open(specs, default)
        if self.metrics is not None:  # the current graphs', after reloads too
            self.metrics.watch_readers(self._graph_readers)
            self.metrics.watch_graphs(self.catalog.statuses)
        self.server.set_serving()
        if self.watcher is None:
            self.watcher = GraphWatcher(self.catalog, self.reload_interval_s)
            self.watcher.start()
        if self._releaser is None:
            self._releaser = threading.Thread(
                target=self._release_loop, name="graph-pages", daemon=True
            )
            self._releaser.start()

    def serving_summary(self) -> str:
        """One line for the start-up log: the graphs served (after load_graphs) and where."""
        graph = self.servicer.graph
        assert graph is not None
        names = self.catalog.names()
        others = f"; graphs {', '.join(names)}" if len(names) > 1 else ""
        return (
            f"draft service serving {graph.path} as {self.catalog.default_name} (max order "
            f"{graph.max_order}, vocab {graph.vocab_size}){others} on {self.address}"
        )

    def learning_summary(self) -> str:
        """One line for the start-up log: whether and how the service learns."""
        learning = self.servicer.learning
        if learning is None:
            return "learning: off (--no-learn): drafts come from the graphs alone"
        config = learning.config
        layers = learning.layers()
        where = next((path for name, tenant, _, path in layers if not tenant), None)
        return (
            f"learning: on, per graph and tenant, each layer up to "
            f"{config.max_bytes / 2**20:g} MiB ({len(layers)} now, "
            f"{sum(layer.estimated_bytes() for _, _, layer, _ in layers) / 2**20:.1f} MiB), "
            f"weight {config.weight:g}, learn log {where or 'none (in memory only)'}"
        )

    def _graph_readers(self) -> int:
        return sum(
            loaded.graph.readers()
            for loaded in self.catalog.loaded_graphs()
            if isinstance(loaded.graph, NGramGraph)
        )

    def reload_graph(self) -> bool:
        """Load the graph now published at the graph path if it is a new one (True when it was
        installed; a refused one is logged and the old graph keeps serving)."""
        if self.watcher is None:
            raise UnavailableError(STILL_OPENING)
        return self.watcher.check(retry=True)

    def request_reload(self) -> None:
        """Ask the watcher to check the graph path now (safe in a signal handler)."""
        if self.watcher is not None:
            self.watcher.trigger()

    def _release_loop(self) -> None:
        """Keep RSS bounded: close the graphs that lingered unused long enough, periodically,
        and unmap the graph pages touched since the last pass once an interval passed without
        drafts (at least every BUSY_RELEASE_S)."""
        interval = self.release_interval_s if self.release_interval_s > 0 else RELEASE_INTERVAL_S
        proposals = self.servicer.proposals
        released_at = time.monotonic()
        while not self._stopped.wait(interval):
            self.catalog.expire()
            if self.release_interval_s <= 0:
                continue
            busy, proposals = self.servicer.proposals != proposals, self.servicer.proposals
            if busy and time.monotonic() - released_at < BUSY_RELEASE_S:
                continue
            released_at = time.monotonic()
            for loaded in self.catalog.loaded_graphs():
                if loaded.acquire():
                    try:
                        loaded.graph.release_pages()
                    finally:
                        loaded.release()

    def stop(self, grace: float | None = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.watcher is not None:
            self.watcher.stop()
        self.server.stop(grace)
        if self._releaser is not None:
            self._releaser.join()
        self.catalog.close()

    def wait_for_termination_signal(self, grace: float = 5.0) -> None:
        self.server.wait_for_termination_signal(grace)
        self.stop(grace)


def start_server(
    graph_path: str | Path | Sequence[str | Path],
    host: str = "127.0.0.1",
    port: int = 50051,
    *,
    default_graph: str | None = None,
    **options: Any,
) -> DraftServer:
    """Start a draft service on host:port (port 0: any free port) with its graphs loaded:
    graph_path is a folder, or a list of ``NAME=PATH`` (or bare folder) entries as the
    ``--graph`` flags take them, default_graph the default one's name (default: the first).

    Health is NOT_SERVING from the bind until the graphs are open, then SERVING. A bad graph
    raises GraphFormatError after the server has been stopped again. A graph published later at
    a graph's path is loaded without a restart (see :class:`DraftServer`). options:
    DraftServer's keyword arguments (learning: see :mod:`draft_service.learning`; None: off).
    """
    entries = [graph_path] if isinstance(graph_path, str | Path) else list(graph_path)
    specs, default = parse_graph_specs([str(entry) for entry in entries], default_graph)
    server = DraftServer(host, port, **options)
    server.start()
    try:
        server.load_graphs(specs, default)
    except BaseException:
        server.stop(0)
        raise
    return server
