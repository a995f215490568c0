"""The draft service over gRPC: speculant.v1.DraftService (Propose, GetGraphInfo).

Two parts: the servicer (DraftServicer), which translates between protos and the drafting core
(:mod:`draft_service.drafting`): unset optional fields take the server's default DraftParams,
DRAFT_STRATEGY_UNSPECIFIED means the default strategy (greedy), bad requests become
INVALID_ARGUMENT naming the field; and the server's lifecycle (DraftServer, start_server, serve):
the graph opened in the background, hot reload, health, stop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc

from draft_service.drafting import Drafter
from draft_service.graph_slot import STILL_OPENING, GraphSlot
from draft_service.learning import Learning, LearningConfig
from draft_service.metrics import DraftMetrics
from draft_service.reload import DEFAULT_RELOAD_INTERVAL_S, GraphWatcher
from speculant.config import DEFAULT_MAX_CONTEXT_TOKENS
from speculant.errors import InvalidArgumentError, UnavailableError
from speculant.graph_reader import NGramGraph
from speculant.grpc_server import (
    RESERVED_THREADS,
    CallLimit,
    ServiceServer,
    map_errors,
    map_stream_errors,
)
from speculant.metrics import Metrics
from speculant.request_context import clean_request_id, request_id_scope
from speculant.tls import ServerTls
from speculant.types import DraftParams, DraftProposal, NextRoundDraft
from speculant.v1 import draft_pb2, draft_pb2_grpc
from speculant.wire import (
    draft_params_from_pb,
    graph_info_to_pb,
    live_stats_to_pb,
    next_round_to_pb,
    proposal_to_pb,
)

log = logging.getLogger(__name__)

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name
# How often the server unmaps the graph pages it touched (see NGramGraph.release_pages).
RELEASE_INTERVAL_S = 0.5


MAX_NEXT_ROUND_DRAFTS = 64
DEFAULT_LEARNING = LearningConfig()  # learning is on unless a caller passes None


def check_context_length(request: draft_pb2.ProposeRequest, limit: int) -> None:
    """INVALID_ARGUMENT naming context_token_ids when it has more than `limit` tokens (checked
    before any work on them)."""
    count = len(request.context_token_ids)
    if count > limit:
        raise InvalidArgumentError(
            "context_token_ids",
            f"has {count} tokens; this draft service takes at most {limit} (--max-context)",
        )


def next_round_request(request: draft_pb2.ProposeRequest) -> tuple[int, int | None]:
    """(how many next-round drafts to prepare, their seed) from a ProposeRequest."""
    count = request.next_round_drafts if request.HasField("next_round_drafts") else 0
    if not 0 <= count <= MAX_NEXT_ROUND_DRAFTS:
        raise InvalidArgumentError(
            "next_round_drafts", f"must be in 0..{MAX_NEXT_ROUND_DRAFTS}, got {count}"
        )
    return count, request.next_round_seed if request.HasField("next_round_seed") else None


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    """Answers Propose and GetGraphInfo from a graph; UNAVAILABLE until load() has run.

    The graph lives in a :class:`~draft_service.graph_slot.GraphSlot` and may be replaced while
    serving (hot reload): each Propose call, each request on a ProposeStream (its draft and its
    next-round drafts) and each GetGraphInfo call is answered wholly from the graph that was
    current when it arrived; a stream opened before a reload uses the new graph from its next
    request on. Each proposal is logged (DEBUG) under the request id it names
    (ProposeRequest.request_id, else the call's).

    At most `max_streams` ProposeStreams are served at once (each holds a worker thread while
    open); more are refused with RESOURCE_EXHAUSTED at once, and their clients use Propose.
    """

    def __init__(
        self,
        defaults: DraftParams | None = None,
        metrics: DraftMetrics | None = None,
        learning: Learning | None = None,
        *,
        max_streams: int = 8,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
    ) -> None:
        """learning: learn from reported generations (Learn); None: Learn answers
        learning = false and drafts come from the graph alone."""
        self.defaults = (defaults or DraftParams()).validate()
        self.metrics = metrics
        self.learning = learning
        self.max_context_tokens = max_context_tokens
        self.slot = GraphSlot(learning.attach if learning is not None else None)
        self.streams = CallLimit(max_streams, "ProposeStream streams", "use Propose or retry")

    def load(self, graph: NGramGraph) -> None:
        """Serve graph (replacing the current one, which closes once no call uses it)."""
        self.slot.install(graph)

    @property
    def graph(self) -> NGramGraph | None:
        """The current graph (None before load)."""
        loaded = self.slot.current
        return loaded.graph if loaded is not None else None

    @property
    def drafter(self) -> Drafter | None:
        """The current graph's drafter (None before load)."""
        loaded = self.slot.current
        return loaded.drafter if loaded is not None else None

    @drafter.setter
    def drafter(self, drafter: Drafter) -> None:
        self.slot.replace_drafter(drafter)

    def _served(
        self, request: draft_pb2.ProposeRequest, proposal: DraftProposal, next_round: int
    ) -> None:
        """Log and count one proposal (DEBUG: one line per round)."""
        log.debug(
            "proposed %d draft tokens for %d context tokens (k=%s, %d next-round drafts)",
            len(proposal.token_ids),
            len(request.context_token_ids),
            request.k if request.HasField("k") else "default",
            next_round,
        )
        if self.metrics is not None:
            self.metrics.observe(len(proposal.token_ids), next_round)

    @map_errors
    def Propose(
        self, request: draft_pb2.ProposeRequest, context: grpc.ServicerContext
    ) -> draft_pb2.ProposeResponse:
        with request_id_scope(clean_request_id(request.request_id)), self.slot.use() as loaded:
            check_context_length(request, self.max_context_tokens)
            params, seed = draft_params_from_pb(request, self.defaults)
            count, next_seed = next_round_request(request)
            drafter = loaded.drafter
            proposal = drafter.propose(request.context_token_ids, params, seed=seed)
            response = (
                draft_pb2.ProposeResponse()
                if count and request.next_round_only
                else proposal_to_pb(proposal)
            )
            drafts: list[NextRoundDraft] = []
            if count:
                drafts = drafter.next_round_drafts(
                    request.context_token_ids, proposal.token_ids, params, next_seed, count
                )
                response.MergeFrom(next_round_to_pb(drafts, params.strategy == "greedy"))
            self._served(request, proposal, len(drafts))
            return response

    @map_stream_errors
    def ProposeStream(
        self, requests: Iterator[draft_pb2.ProposeRequest], context: grpc.ServicerContext
    ) -> Iterator[draft_pb2.ProposeResponse]:
        """Propose for each request on the stream, in order (a bad request ends the stream).

        A request with next_round_drafts gets its draft first, then a second response with the
        prepared drafts, computed while the client is busy verifying the first.
        """
        if self.slot.current is None:
            raise UnavailableError(STILL_OPENING)
        with self.streams.hold():
            yield from self._propose_stream(requests)

    def _propose_stream(
        self, requests: Iterator[draft_pb2.ProposeRequest]
    ) -> Iterator[draft_pb2.ProposeResponse]:
        for request in requests:
            with request_id_scope(clean_request_id(request.request_id)):
                check_context_length(request, self.max_context_tokens)
                params, seed = draft_params_from_pb(request, self.defaults)
                count, next_seed = next_round_request(request)
                with self.slot.use() as loaded:
                    drafter = loaded.drafter
                    proposal = drafter.propose(request.context_token_ids, params, seed=seed)
                    if not count:
                        self._served(request, proposal, 0)
                        yield proposal_to_pb(proposal)
                        continue
                    if not request.next_round_only:
                        yield proposal_to_pb(proposal)
                    # Prepared after the draft went out, while the client verifies it.
                    drafts = drafter.next_round_drafts(
                        request.context_token_ids, proposal.token_ids, params, next_seed, count
                    )
                    self._served(request, proposal, len(drafts))
                    yield next_round_to_pb(drafts, params.strategy == "greedy")

    @map_errors
    def GetGraphInfo(
        self, request: draft_pb2.GetGraphInfoRequest, context: grpc.ServicerContext
    ) -> draft_pb2.GetGraphInfoResponse:
        with self.slot.use() as loaded:
            response = graph_info_to_pb(loaded.graph)
            layer = loaded.drafter.live
            if layer is not None:
                response.live.CopyFrom(live_stats_to_pb(layer.stats(), layer.weight))
            return response

    @map_errors
    def Learn(
        self, request: draft_pb2.LearnRequest, context: grpc.ServicerContext
    ) -> draft_pb2.LearnResponse:
        """Learn a finished generation (see draft.proto); learning = false when off."""
        if self.learning is None:
            return draft_pb2.LearnResponse(learning=False)
        generation_id = request.generation_id or uuid.uuid4().hex
        with self.slot.use() as loaded:
            outcome = self.learning.learn(
                request.token_ids, generation_id, request.persist, loaded.graph.vocab_size
            )
            weight = self.learning.config.weight
        if self.metrics is not None:
            self.metrics.observe_learned(outcome.learned_tokens, outcome.stats.estimated_bytes)
        return draft_pb2.LearnResponse(
            learning=True,
            learned_tokens=outcome.learned_tokens,
            persisted=outcome.persisted,
            live=live_stats_to_pb(outcome.stats, weight),
        )


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
    ) -> None:
        """metrics: count calls and drafts in it (its /metrics endpoint is the caller's).
        learning: learn from reported generations (draft_service.learning); None: off.
        max_context_tokens: longer Propose contexts are refused (INVALID_ARGUMENT)."""
        if reload_interval_s < 0:
            raise InvalidArgumentError(
                "reload_interval_s", f"must be >= 0, got {reload_interval_s}"
            )
        if max_context_tokens < 1:
            raise InvalidArgumentError(
                "max_context_tokens", f"must be >= 1, got {max_context_tokens}"
            )
        self.metrics = None if metrics is None else DraftMetrics(metrics.registry)
        self.servicer = DraftServicer(
            defaults,
            self.metrics,
            Learning(learning) if learning is not None else None,
            max_streams=workers,
            max_context_tokens=max_context_tokens,
        )
        self.server = ServiceServer(
            host,
            port,
            [SERVICE_NAME],
            max_workers=workers + RESERVED_THREADS,
            tls=tls,
            metrics=metrics,
        )
        draft_pb2_grpc.add_DraftServiceServicer_to_server(self.servicer, self.server.grpc_server)
        # a damaged graph turns health NOT_SERVING, the next graph installed SERVING again
        self.servicer.slot.on_health = self.server.set_serving
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
        """Open the graph (GraphFormatError if bad), then report SERVING and watch its path."""
        graph = NGramGraph.open(graph_path)
        self.servicer.load(graph)
        if self.metrics is not None:  # the current graph's, after reloads too
            self.metrics.watch_readers(self._graph_readers)
        self.server.set_serving()
        if self.watcher is None:
            self.watcher = GraphWatcher(graph_path, self.servicer.slot, self.reload_interval_s)
            self.watcher.start()
        if self.release_interval_s > 0 and self._releaser is None:
            self._releaser = threading.Thread(
                target=self._release_loop, name="graph-pages", daemon=True
            )
            self._releaser.start()
        return graph

    def learning_summary(self) -> str:
        """One line for the start-up log: whether and how the service learns."""
        learning = self.servicer.learning
        if learning is None:
            return "learning: off (--no-learn): drafts come from the graph alone"
        config = learning.config
        where = learning.log_path()
        return (
            f"learning: on, live layer up to {config.max_bytes / 2**20:g} MiB (now "
            f"{learning.layer.estimated_bytes() / 2**20 if learning.layer else 0:.1f} MiB), "
            f"weight {config.weight:g}, learn log {where or 'none (in memory only)'}"
        )

    def _graph_readers(self) -> int:
        current = self.servicer.slot.current
        return current.graph.readers() if current is not None else 0

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
        """Keep RSS bounded: unmap the graph pages touched since the last pass, periodically."""
        while not self._stopped.wait(self.release_interval_s):
            with contextlib.suppress(UnavailableError), self.servicer.slot.use() as loaded:
                loaded.graph.release_pages()

    def stop(self, grace: float | None = 5.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.watcher is not None:
            self.watcher.stop()
        self.server.stop(grace)
        if self._releaser is not None:
            self._releaser.join()
        self.servicer.slot.close()

    def wait_for_termination_signal(self, grace: float = 5.0) -> None:
        self.server.wait_for_termination_signal(grace)
        self.stop(grace)


def start_server(
    graph_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 50051,
    *,
    workers: int = 8,
    defaults: DraftParams | None = None,
    tls: ServerTls | None = None,
    reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
    metrics: Metrics | None = None,
    learning: LearningConfig | None = DEFAULT_LEARNING,
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
) -> DraftServer:
    """Start a draft service on host:port (port 0: any free port) with the graph loaded.

    Health is NOT_SERVING from the bind until the graph is open, then SERVING. A bad graph
    raises GraphFormatError after the server has been stopped again. A graph published later at
    graph_path is loaded without a restart (see :class:`DraftServer`). learning: see
    :mod:`draft_service.learning` (None: off).
    """
    server = DraftServer(
        host,
        port,
        workers=workers,
        defaults=defaults,
        tls=tls,
        reload_interval_s=reload_interval_s,
        metrics=metrics,
        learning=learning,
        max_context_tokens=max_context_tokens,
    )
    server.start()
    try:
        server.load_graph(graph_path)
    except BaseException:
        server.stop(0)
        raise
    return server


def serve(
    graph_path: str | Path,
    host: str = "127.0.0.1",
    port: int = 50051,
    *,
    workers: int = 8,
    defaults: DraftParams | None = None,
) -> None:
    """Run the draft service until SIGINT/SIGTERM, then stop gracefully."""
    server = start_server(graph_path, host, port, workers=workers, defaults=defaults)
    graph = server.servicer.graph
    assert graph is not None
    log.info(
        "draft service serving %s (max order %d, vocab %d) on %s",
        graph.path,
        graph.max_order,
        graph.vocab_size,
        server.address,
    )
    server.wait_for_termination_signal()
