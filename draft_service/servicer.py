"""The draft service's servicer: speculant.v1.DraftService (Propose, ProposeStream,
GetGraphInfo, Learn) answered from the current graph's drafter.

It only translates between protos and the drafting core (:mod:`draft_service.drafting`): unset
optional fields take the server's default DraftParams, DRAFT_STRATEGY_UNSPECIFIED means the
default strategy (greedy), bad requests become INVALID_ARGUMENT naming the field, and the graph's
meta record becomes a GetGraphInfoResponse (:func:`graph_info_to_pb`). The server
around it (bind, graph loading, reload, health, stop) is :mod:`draft_service.server`.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import grpc

from draft_service.drafting import Drafter
from draft_service.graph_slot import STILL_OPENING, GraphSlot
from draft_service.learning import Learning
from draft_service.metrics import DraftMetrics
from speculant.config import DEFAULT_MAX_CONTEXT_TOKENS
from speculant.draft_params import DraftParams
from speculant.errors import InvalidArgumentError, UnavailableError
from speculant.graph_reader import NGramGraph
from speculant.grpc_server import CallLimit, map_errors, map_stream_errors
from speculant.request_context import clean_request_id, request_id_scope
from speculant.types import DraftProposal, NextRoundDraft
from speculant.v1 import draft_pb2, draft_pb2_grpc
from speculant.wire import (
    draft_params_from_pb,
    live_stats_to_pb,
    next_round_to_pb,
    proposal_to_pb,
)

# The service's logger (not this module's name): its lines are filtered on it.
log = logging.getLogger("draft_service.server")

MAX_NEXT_ROUND_DRAFTS = 64


def check_context_length(request: draft_pb2.ProposeRequest, limit: int) -> None:
    """INVALID_ARGUMENT naming context_token_ids when it has more than `limit` tokens (checked
    before any work on them)."""
    count = len(request.context_token_ids)
    if count > limit:
        raise InvalidArgumentError(
            "context_token_ids",
            f"has {count} tokens; this draft service takes at most {limit} (--max-context)",
        )


def graph_info_to_pb(graph: NGramGraph) -> draft_pb2.GetGraphInfoResponse:
    """The GetGraphInfoResponse describing a graph (its meta record, path and version)."""
    meta = graph.meta
    return draft_pb2.GetGraphInfoResponse(
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
        long_context: int = 0,
    ) -> None:
        """learning: learn from reported generations (Learn); None: Learn answers
        learning = false and drafts come from the graph alone. long_context: see
        NGramGraph.use_long_context (0: off)."""
        self.defaults = (defaults or DraftParams()).validate()
        self.metrics = metrics
        self.learning = learning
        self.max_context_tokens = max_context_tokens
        self.slot = GraphSlot(
            learning.attach if learning is not None else None, long_context=long_context
        )
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
