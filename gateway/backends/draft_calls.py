"""One Propose in flight: the unary call and the stream call the coordinator overlaps with its
verify (next-round drafts)."""

from __future__ import annotations

import logging
from typing import Protocol

from gateway.backends.draft_replicas import Replica, stream_refused
from gateway.backends.streams import StreamExchange
from speculant.errors import RemoteError, UnavailableError
from speculant.types import (
    DraftProposal,
    NextRoundDraft,
)
from speculant.v1 import (
    draft_pb2,
)
from speculant.wire import is_greedy_request, proposal_from_pb

log = logging.getLogger(__name__)


class ReplicaCalls(Protocol):
    """What a draft call needs of its client (gateway.backends.draft_client.GrpcDraftClient):
    propose on any replica, and the replica streams it checks out, reads, returns and holds off."""

    def propose_message(
        self, request: draft_pb2.ProposeRequest, skip: Replica | None = None
    ) -> DraftProposal: ...

    def receive(self, replica: Replica, exchange: StreamExchange) -> draft_pb2.ProposeResponse: ...

    def check_in(self, replica: Replica, exchange: StreamExchange) -> None: ...

    def hold_off(self, replica: Replica) -> None: ...


class UnaryDraftCall:
    """A DraftCall (see gateway.interfaces) without a stream: the draft by unary Propose when
    asked for (any replica, failing over), no next-round drafts."""

    def __init__(
        self, client: ReplicaCalls, request: draft_pb2.ProposeRequest, draft_known: bool
    ) -> None:
        self._client = client
        self._request = request
        self._draft_known = draft_known

    def proposal(self) -> DraftProposal:
        if self._draft_known:
            raise ValueError("this call was made for next-round drafts only")
        return self._client.propose_message(self._request)

    def next_round(self) -> list[NextRoundDraft]:
        return []

    def discard(self) -> None:
        pass


class GrpcDraftCall:
    """One ProposeStream request in flight (see gateway.interfaces.DraftCall): its response, then
    (when asked for) a second response with the next round's drafts. The stream goes back to
    the client's pool only once both are read; a failed or discarded one is dropped."""

    def __init__(
        self,
        client: ReplicaCalls,
        replica: Replica,
        exchange: StreamExchange,
        request: draft_pb2.ProposeRequest,
    ) -> None:
        self._client = client
        self._replica = replica
        self._exchange: StreamExchange | None = exchange
        self._request = request
        self._greedy = is_greedy_request(request)
        self._expects_next_round = request.next_round_drafts > 0
        self._expects_draft = not (self._expects_next_round and request.next_round_only)
        self._draft: DraftProposal | None = None

    def proposal(self) -> DraftProposal:
        if not self._expects_draft:
            raise ValueError("this call was made for next-round drafts only")
        if self._draft is None:
            exchange = self._exchange
            try:
                if exchange is None:
                    raise UnavailableError("the draft call was discarded")
                response = self._client.receive(self._replica, exchange)
                self._draft = proposal_from_pb(response, self._greedy)
            except (RemoteError, UnavailableError) as exc:
                request = self._request_without_next_round()
                if isinstance(exc, RemoteError) and exchange and stream_refused(exc, exchange):
                    self._exchange = None
                    self._replica.streams.refused(exchange)
                    self._expects_next_round = False
                    self._draft = self._client.propose_message(request)
                    return self._draft
                self.discard()
                self._client.hold_off(self._replica)
                log.debug("draft replica %s failed: %s", self._replica.address, exc)
                self._draft = self._client.propose_message(request, skip=self._replica)
            else:
                self._finish_unless_next_round()
        return self._draft

    def next_round(self) -> list[NextRoundDraft]:
        if self._exchange is None or not self._expects_next_round:
            return []
        try:
            if self._expects_draft and self._draft is None:  # the draft's response comes first
                first = self._client.receive(self._replica, self._exchange)
                self._draft = proposal_from_pb(first, self._greedy)
            response = self._client.receive(self._replica, self._exchange)
        except (RemoteError, UnavailableError) as exc:
            log.debug("no next-round drafts: %s", exc)
            self.discard()
            return []
        self._expects_next_round = False
        self._finish_unless_next_round()
        return [
            NextRoundDraft(d.accepted_count, d.next_token_id, proposal_from_pb(d, self._greedy))
            for d in response.next_round
        ]

    def discard(self) -> None:
        if self._exchange is not None:
            self._replica.streams.discard(self._exchange)
            self._exchange = None

    def _finish_unless_next_round(self) -> None:
        if self._exchange is not None and not self._expects_next_round:
            self._client.check_in(self._replica, self._exchange)
            self._exchange = None

    def _request_without_next_round(self) -> draft_pb2.ProposeRequest:
        request = draft_pb2.ProposeRequest()
        request.CopyFrom(self._request)
        request.ClearField("next_round_drafts")
        request.ClearField("next_round_seed")
        return request


# The most a verifier call, or one step of a Session stream, waits for its answer (a verifier that
# answers its keepalive pings but not the call: stuck, not frozen).
