"""The draft service's servicers: speculant.v1.DraftService (Propose, ProposeStream,
GetGraphInfo, Learn) answered from the drafter of the graph and tenant each request names, and
speculant.v1.AdminService (AddGraph, RemoveGraph, ListGraphs) changing the catalog
(:mod:`draft_service.catalog`).

They only translate between protos and the drafting core (:mod:`draft_service.drafting`): unset
optional fields take the server's default DraftParams, DRAFT_STRATEGY_UNSPECIFIED means the
default strategy (greedy), bad requests become INVALID_ARGUMENT naming the field, an unknown
graph NOT_FOUND naming it, and a graph's meta record becomes a GetGraphInfoResponse
(:func:`graph_info_to_pb`). The server around them (bind, graph loading, reload, health, stop) is
:mod:`draft_service.server`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator, Sequence

import grpc
import numpy as np

from draft_service.catalog import STILL_OPENING, GraphCatalog
from draft_service.drafting import Drafter
from draft_service.learning import Learning
from draft_service.metrics import DraftMetrics
from speculant.config import DEFAULT_MAX_CONTEXT_TOKENS, DraftParams
from speculant.errors import InvalidArgumentError, UnavailableError
from speculant.graph_catalog import NO_GRAPH, CatalogFile, GraphSpec, graph_name_of
from speculant.graph_reader import NGramGraph, folder_bytes
from speculant.grpc_server import CallLimit, map_errors, map_stream_errors
from speculant.request_context import clean_request_id, request_id_scope
from speculant.types import DraftProposal
from speculant.v1 import admin_pb2, admin_pb2_grpc, draft_pb2, draft_pb2_grpc
from speculant.wire import (
    draft_params_from_pb,
    graph_status_to_pb,
    live_stats_to_pb,
    proposal_to_pb,
    propose_params_key,
)

# The service's logger (not this module's name): its lines are filtered on it.
log = logging.getLogger("draft_service.server")


def context_of(request: draft_pb2.ProposeRequest) -> np.ndarray:
    """The request's context as an array [n] (int64), copied once: checking and slicing the
    repeated proto field token by token costs more than ten times the copy (docs/benchmarks.md,
    "The hops, taken apart")."""
    return np.asarray(request.context_token_ids, dtype=np.int64)


def check_context_length(request: draft_pb2.ProposeRequest, limit: int) -> None:
    """INVALID_ARGUMENT naming context_token_ids when it has more than `limit` tokens (checked
    before any work on them)."""
    count = len(request.context_token_ids)
    if count > limit:
        raise InvalidArgumentError(
            "context_token_ids",
            f"has {count} tokens; this draft service takes at most {limit} (--max-context)",
        )


def graph_info_to_pb(graph: NGramGraph, name: str = "") -> draft_pb2.GetGraphInfoResponse:
    """The GetGraphInfoResponse describing a graph (its meta record, path, version, files)."""
    meta = graph.meta
    return draft_pb2.GetGraphInfoResponse(
        name=name,
        graph_id=graph.graph_id,
        graph_bytes=folder_bytes(graph.path),
        resident_bytes=graph.resident_bytes(),
        format_version=meta.format_version,
        max_order=meta.max_order,
        context_window=graph.window,
        tokenizer_name=meta.tokenizer_name,
        tokenizer_fingerprint=meta.tokenizer_fingerprint,
        vocab_size=meta.vocab_size,
        corpus_documents=meta.corpus_documents,
        corpus_tokens=meta.corpus_tokens,
        orders=[
            draft_pb2.OrderStats(
                order=o.order, contexts=o.contexts, ngrams=o.ngrams, total_count=o.total_count
            )
            for o in meta.orders
        ],
        build_params_json=json.dumps(meta.build_params, sort_keys=True),
        built_at=meta.built_at,
        graph_path=str(graph.path.resolve()),
        graph_version=meta.version,
    )


class RequestParams:
    """The validated DraftParams of ProposeRequests, read once per distinct parameter set: a
    gateway sends the same set round after round, so later rounds skip reading and validating
    it (a bad set is never kept: it raises every time). Thread-safe (the GIL guards the dict);
    at most `size` sets are kept, all forgotten when more come."""

    def __init__(self, defaults: DraftParams, size: int = 256) -> None:
        self.defaults = defaults
        self.size = size
        self._known: dict[tuple[object, ...], DraftParams] = {}

    def read(self, request: draft_pb2.ProposeRequest) -> tuple[DraftParams, int | None]:
        """(validated DraftParams, seed or None), as draft_params_from_pb reads them."""
        key = propose_params_key(request)
        params = self._known.get(key)
        if params is None:
            params, _ = draft_params_from_pb(request, self.defaults)
            if len(self._known) >= self.size:
                self._known.clear()
            self._known[key] = params
        return params, request.seed if request.HasField("seed") else None


class DraftServicer(draft_pb2_grpc.DraftServiceServicer):
    """Answers Propose and GetGraphInfo from the catalog's graphs; UNAVAILABLE until they are
    open.

    A graph may be replaced while serving (hot reload, AddGraph): each Propose call, each
    request on a ProposeStream and each GetGraphInfo call
    is answered wholly from one graph: the build its request pins (graph_id) while that
    lingers, else the one its name serves when it arrives. Each proposal is logged (DEBUG)
    under the request id it names (ProposeRequest.request_id, else the call's).

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
        long_context: int = 0,
        catalog_file: CatalogFile | None = None,
    ) -> None:
        """learning: learn from reported generations (Learn); None: Learn answers
        learning = false and drafts come from the graphs alone. long_context: see
        NGramGraph.use_long_context (0: off). catalog_file: see GraphCatalog."""
        self.defaults = (defaults or DraftParams()).validate()
        self.params = RequestParams(self.defaults)
        self.proposals = 0  # answered so far (the server releases graph pages when it idles)
        self.metrics = metrics
        self.learning = learning
        self.max_context_tokens = max_context_tokens
        self.catalog = GraphCatalog(learning, long_context=long_context, catalog_file=catalog_file)
        self.streams = CallLimit(max_streams, "ProposeStream streams", "use Propose or retry")

    def open(self, specs: Sequence[GraphSpec], default: str) -> None:
        """Serve the graphs of the flags (and of the catalog file)."""
        if self.learning is not None:
            self.learning.default_graph = default
        self.catalog.open(specs, default)

    def load(self, graph: NGramGraph, name: str = "") -> None:
        """Serve an opened graph under name (default: the default graph's name, else its
        folder's, which becomes the default)."""
        name = name or self.catalog.default_name or graph_name_of(graph.path)
        if not self.catalog.default_name:
            self.catalog.default_name = name
            if self.learning is not None:
                self.learning.default_graph = name
        self.catalog.add_opened(name, graph)

    @property
    def graph(self) -> NGramGraph | None:
        """The default graph (None before it is open)."""
        loaded = self.catalog.current(self.catalog.default_name)
        return loaded.graph if loaded is not None else None

    @property
    def drafter(self) -> Drafter | None:
        """The default graph's default tenant's drafter (None before it is open)."""
        loaded = self.catalog.current(self.catalog.default_name)
        return loaded.drafter if loaded is not None else None

    @drafter.setter
    def drafter(self, drafter: Drafter) -> None:
        loaded = self.catalog.current(self.catalog.default_name)
        if loaded is None:
            raise UnavailableError(STILL_OPENING)
        loaded.drafter = drafter

    def _served(self, request: draft_pb2.ProposeRequest, proposal: DraftProposal) -> None:
        """Log and count one proposal (DEBUG: one line per round)."""
        self.proposals += 1  # not atomic across threads: a count to tell busy from idle
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "proposed %d draft tokens for %d context tokens (graph %s, k=%s)",
                len(proposal.token_ids),
                len(request.context_token_ids),
                request.graph or "default",
                request.k if request.HasField("k") else "default",
            )
        if self.metrics is not None:
            self.metrics.observe(len(proposal.token_ids))

    def _use(self, request: draft_pb2.ProposeRequest):
        """The (loaded graph, drafter) the request drafts with (see GraphCatalog.use)."""
        return self.catalog.use(request.graph, request.tenant, request.graph_id)

    @map_errors
    def Propose(
        self, request: draft_pb2.ProposeRequest, context: grpc.ServicerContext
    ) -> draft_pb2.ProposeResponse:
        with request_id_scope(clean_request_id(request.request_id)), self._use(request) as used:
            _, drafter = used
            check_context_length(request, self.max_context_tokens)
            params, seed = self.params.read(request)
            proposal = drafter.propose(context_of(request), params, seed=seed)
            self._served(request, proposal)
            return proposal_to_pb(proposal, params.strategy == "greedy")

    @map_stream_errors
    def ProposeStream(
        self, requests: Iterator[draft_pb2.ProposeRequest], context: grpc.ServicerContext
    ) -> Iterator[draft_pb2.ProposeResponse]:
        """Propose for each request on the stream, in order (a bad request ends the stream)."""
        if self.catalog.current(self.catalog.default_name) is None:
            raise UnavailableError(STILL_OPENING)
        with self.streams.hold():
            yield from self._propose_stream(requests)

    def _propose_stream(
        self, requests: Iterator[draft_pb2.ProposeRequest]
    ) -> Iterator[draft_pb2.ProposeResponse]:
        for request in requests:
            with request_id_scope(clean_request_id(request.request_id)):
                check_context_length(request, self.max_context_tokens)
                params, seed = self.params.read(request)
                with self._use(request) as (_, drafter):
                    proposal = drafter.propose(context_of(request), params, seed=seed)
                    self._served(request, proposal)
                    yield proposal_to_pb(proposal, params.strategy == "greedy")

    @map_errors
    def GetGraphInfo(
        self, request: draft_pb2.GetGraphInfoRequest, context: grpc.ServicerContext
    ) -> draft_pb2.GetGraphInfoResponse:
        name = request.graph or self.catalog.default_name
        if name == NO_GRAPH:
            raise InvalidArgumentError("graph", f'"{NO_GRAPH}" asks for no graph: it has no info')
        with self.catalog.use(name) as (loaded, drafter):
            response = graph_info_to_pb(loaded.graph, name)
            response.graph_names.extend(self.catalog.names())
            layer = drafter.live
            if layer is not None:
                response.live.CopyFrom(live_stats_to_pb(layer.stats(), layer.weight))
            return response

    @map_errors
    def Learn(
        self, request: draft_pb2.LearnRequest, context: grpc.ServicerContext
    ) -> draft_pb2.LearnResponse:
        """Learn a finished generation into its (graph, tenant)'s layer (see draft.proto);
        learning = false when off."""
        outcome = self.catalog.learn(
            request.graph,
            request.tenant,
            request.token_ids,
            request.generation_id or uuid.uuid4().hex,
            request.persist,
        )
        if outcome is None:
            return draft_pb2.LearnResponse(learning=False)
        assert self.learning is not None
        if self.metrics is not None:
            self.metrics.observe_learned(outcome.learned_tokens, outcome.stats.estimated_bytes)
        return draft_pb2.LearnResponse(
            learning=True,
            learned_tokens=outcome.learned_tokens,
            persisted=outcome.persisted,
            live=live_stats_to_pb(outcome.stats, self.learning.config.weight),
        )


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    """speculant.v1.AdminService on a draft service: the catalog changed while serving (the
    caller's admin token is checked before a call gets here: speculant.auth)."""

    def __init__(self, catalog: GraphCatalog) -> None:
        self.catalog = catalog

    @map_errors
    def AddGraph(
        self, request: admin_pb2.AddGraphRequest, context: grpc.ServicerContext
    ) -> admin_pb2.AddGraphResponse:
        if not request.path:
            raise InvalidArgumentError("path", "give the graph's folder")
        _, replaced = self.catalog.add(request.name, request.path)
        status = graph_status_to_pb(self.catalog.status(request.name))
        return admin_pb2.AddGraphResponse(graph=status, replaced=replaced)

    @map_errors
    def RemoveGraph(
        self, request: admin_pb2.RemoveGraphRequest, context: grpc.ServicerContext
    ) -> admin_pb2.RemoveGraphResponse:
        self.catalog.remove(request.name)
        return admin_pb2.RemoveGraphResponse()

    @map_errors
    def ListGraphs(
        self, request: admin_pb2.ListGraphsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ListGraphsResponse:
        return admin_pb2.ListGraphsResponse(
            graphs=[graph_status_to_pb(status) for status in self.catalog.statuses()]
        )
