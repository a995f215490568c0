"""gRPC implementations of the coordinator's drafter and verifier interfaces.

Channels are opened once and kept open; each call carries a timeout. Backend errors become
:class:`speculant.errors.RemoteError` with the backend's status code, so a user mistake caught
by a backend (INVALID_ARGUMENT) reaches the client as such and a dead backend as UNAVAILABLE.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.stream_pool import StreamPool
from speculant.config import DEFAULT_DRAFT_REFRESH_S, DEFAULT_MAX_CONTEXT_TOKENS
from speculant.errors import InvalidArgumentError, NotFoundError, RemoteError, UnavailableError
from speculant.grpc_server import CLIENT_KEEPALIVE_OPTIONS, GRPC_OPTIONS
from speculant.request_context import REQUEST_ID, request_metadata
from speculant.strategies import STRATEGY_TO_PROTO
from speculant.stream_exchange import StreamExchange
from speculant.tls import ClientTls, open_channel
from speculant.types import (
    DraftParams,
    DraftProposal,
    ModelInfo,
    NextRoundDraft,
    SparseDistribution,
    VerifyResult,
)
from speculant.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)

log = logging.getLogger(__name__)


# Reconnect quickly after a backend restarts (gRPC's default backoff starts at 1 s, up to 120 s).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


# The deadline (time.monotonic()) of the client request being served, if it has one: every
# backend call made for it carries the remaining time, so a request past its deadline stops
# its backends' work too. Set by the gateway around each request (see `request_deadline`).
REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("request_deadline", default=None)


@contextmanager
def request_deadline(remaining_s: float | None) -> Iterator[None]:
    """Within this block, backend calls carry at most `remaining_s` (None: no deadline)."""
    token = REQUEST_DEADLINE.set(
        None if remaining_s is None else time.monotonic() + max(0.0, remaining_s)
    )
    try:
        yield
    finally:
        REQUEST_DEADLINE.reset(token)


def remaining_time(default_s: float | None) -> float | None:
    """The smaller of default_s and the time left before the request's deadline."""
    deadline = REQUEST_DEADLINE.get()
    if deadline is None:
        return default_s
    left = max(0.001, deadline - time.monotonic())
    return left if default_s is None else min(default_s, left)


def _channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    return open_channel(address, tls, GRPC_OPTIONS + RECONNECT_OPTIONS + CLIENT_KEEPALIVE_OPTIONS)


def propose_request(
    context_ids: Sequence[int], params: DraftParams, seed: int | None
) -> draft_pb2.ProposeRequest:
    """The ProposeRequest for a drafting call (every parameter explicit), naming the request
    being served (see speculant.request_context)."""
    return draft_pb2.ProposeRequest(
        request_id=REQUEST_ID.get() or "",
        context_token_ids=context_ids[-DEFAULT_MAX_CONTEXT_TOKENS:],  # what a replica takes
        k=params.k,
        strategy=STRATEGY_TO_PROTO[params.strategy],
        attentive_mix=params.attentive_mix,
        order_bias=params.order_bias,
        mix_temperature=params.mix_temperature,
        reliability_weight=params.reliability_weight,
        entropy_penalty=params.entropy_penalty,
        seed=seed,
        mixing=params.mixing,
        escape_weight=params.escape_weight,
        min_draft_prob=params.min_draft_prob,
        overlay_weight=params.overlay_weight,
        tree_nodes=params.tree_nodes,
    )


def _is_greedy(request: draft_pb2.ProposeRequest) -> bool:
    return request.strategy == common_pb2.DRAFT_STRATEGY_GREEDY


class _Watchdog:
    """Cancels stream exchanges that run past their deadline (streams have no per-message
    timeout). One thread, waking every `tick_s` only while calls are in flight."""

    def __init__(self, tick_s: float = 0.01, name: str = "draft-watchdog") -> None:
        self._tick_s = tick_s
        self._in_flight: dict[int, tuple[float, StreamExchange]] = {}
        self._lock = threading.Condition()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def watch(self, exchange: StreamExchange, timeout_s: float) -> int:
        with self._lock:
            ticket = id(exchange)
            self._in_flight[ticket] = (time.monotonic() + timeout_s, exchange)
            self._lock.notify()
            return ticket

    def done(self, ticket: int) -> bool:
        """The exchange is answered (or failed); False when the watchdog had cancelled it."""
        with self._lock:
            return self._in_flight.pop(ticket, None) is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._in_flight:
                    self._lock.wait()
                now = time.monotonic()
                late = [t for t, (deadline, _) in self._in_flight.items() if deadline < now]
                for ticket in late:
                    self._in_flight.pop(ticket)[1].cancel()
            time.sleep(self._tick_s)


def expand_addresses(addresses: Sequence[str]) -> list[str]:
    """Replica addresses: HOST:PORT entries as given; ``dns:NAME:PORT`` becomes one replica per
    address NAME resolves to now (GrpcDraftClient resolves again every refresh interval)."""
    out: list[str] = []
    for address in addresses:
        if not address.startswith("dns:"):
            out.append(address)
            continue
        name, _, port = address.removeprefix("dns:").rpartition(":")
        if not name or not port.isdigit():
            raise InvalidArgumentError("--draft", f"{address!r} is not dns:NAME:PORT")
        try:
            infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
        except OSError as exc:
            raise UnavailableError(f"--draft: cannot resolve {name}: {exc}") from exc
        for family, *_, sockaddr in infos:
            host = f"[{sockaddr[0]}]" if family == socket.AF_INET6 else sockaddr[0]
            if f"{host}:{port}" not in out:
                out.append(f"{host}:{port}")
    return out


# A draft replica that failed is asked last for this long (then it is back in the rotation).
REPLICA_HOLD_OFF_S = 1.0


@dataclass(eq=False)
class _Replica:
    """One draft service: its stub, its open streams, and its hold-off after a failure."""

    address: str
    stub: draft_pb2_grpc.DraftServiceStub
    streams: StreamPool
    held_off_until: float = 0.0  # time.monotonic()

    @classmethod
    def connect(cls, address: str, tls: ClientTls | None) -> _Replica:
        stub = draft_pb2_grpc.DraftServiceStub(_channel(address, tls))
        return cls(address, stub, StreamPool(lambda: StreamExchange(stub.ProposeStream, None)))


def _refused(exc: RemoteError, exchange: StreamExchange) -> bool:
    """Whether a stream failed because the service refused it (it serves its limit of streams,
    see speculant.grpc_server.CallLimit), not because of the request or the service."""
    return exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and exchange.responses == 0


LEARN_TIMEOUT_S = 2.0  # one Learn report to one draft replica (off the request's path)


@dataclass
class LearnDelivery:
    """Where one Learn report went: the replicas that took it, failed, and persisted it."""

    delivered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    persisted_by: str = ""


class GrpcDraftClient:
    """Drafts from one or more draft-service replicas over open streams (ProposeStream), round
    robin, failing over to the next replica on an error or a timeout. A replica that failed goes
    to the back of the order for REPLICA_HOLD_OFF_S (a passive health check), so a dead replica
    costs one failed call per hold-off, not one per round.

    The replica set can change while calls run (``refresh``): with ``dns:NAME:PORT`` entries
    (see expand_addresses) a background thread resolves them again every ``refresh_s`` seconds,
    so replicas a scaler adds are used and removed ones are dropped without a restart.

    Streams: each replica's open streams are pooled (gateway.stream_pool): idle ones are closed
    after a few seconds, and a replica that refuses a new stream (it serves its limit: each
    open stream holds one of its threads) is asked by unary Propose until it takes streams
    again, which is not a failure."""

    def __init__(
        self,
        addresses: Sequence[str],
        timeout_s: float = 0.25,
        tls: ClientTls | None = None,
        refresh_s: float = DEFAULT_DRAFT_REFRESH_S,
        resolve: Callable[[Sequence[str]], list[str]] = expand_addresses,
    ) -> None:
        """addresses: HOST:PORT and dns:NAME:PORT entries. tls: connect over TLS (see
        speculant.tls), else plaintext. refresh_s: resolve dns: entries again this often
        (0 = only at start-up). resolve: entries -> HOST:PORT replicas (tests replace it)."""
        if not addresses:
            raise ValueError("at least one draft service address is needed")
        self._entries = list(addresses)
        self._resolve = resolve
        self._tls = tls
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._replicas: list[_Replica] = []
        self._turn = itertools.count()
        self._watchdog = _Watchdog()
        self._stopped = threading.Event()
        self.refresh()
        if refresh_s > 0 and any(a.startswith("dns:") for a in self._entries):
            threading.Thread(
                target=self._refresh_loop, args=(refresh_s,), name="draft-dns", daemon=True
            ).start()
        threading.Thread(target=self._trim_loop, name="draft-streams", daemon=True).start()

    @property
    def addresses(self) -> list[str]:
        """The current replicas' HOST:PORT addresses."""
        return [replica.address for replica in self._replicas]

    def refresh(self) -> None:
        """Resolve the entries again and switch to that replica set: known replicas keep their
        streams and hold-off, new ones are added, gone ones stop getting calls (their idle
        streams are closed; calls in flight on them finish)."""
        addresses = self._resolve(self._entries)
        if not addresses:
            raise UnavailableError(f"--draft: {', '.join(self._entries)} resolved to nothing")
        with self._lock:
            known = {replica.address: replica for replica in self._replicas}
            replicas = [known.get(a) or _Replica.connect(a, self._tls) for a in addresses]
            current = set(addresses)
            gone = [r for r in self._replicas if r.address not in current]
            self._replicas = replicas
        for replica in gone:
            log.info("draft replica %s left the set", replica.address)
            replica.streams.close()
        for replica in replicas:
            if replica.address not in known and known:
                log.info("draft replica %s joined the set", replica.address)

    def _refresh_loop(self, interval_s: float) -> None:
        while not self._stopped.wait(interval_s):
            try:
                self.refresh()
            except (InvalidArgumentError, UnavailableError) as exc:  # keep the current set
                log.warning("draft replicas not refreshed: %s", exc)

    def _trim_loop(self, interval_s: float = 1.0) -> None:
        """Close the streams that stayed idle too long (they hold a draft service thread)."""
        while not self._stopped.wait(interval_s):
            for replica in self._replicas:
                replica.streams.trim()

    def close(self) -> None:
        """Stop refreshing the replica set and close the idle streams."""
        self._stopped.set()
        for replica in self._replicas:
            replica.streams.close()

    def _replica_order(self) -> list[_Replica]:
        """Round robin, replicas held off after a failure last."""
        with self._lock:
            replicas = self._replicas
            first = next(self._turn) % len(replicas)
        order = replicas[first:] + replicas[:first]
        now = time.monotonic()
        return sorted(order, key=lambda r: r.held_off_until > now)  # stable: keeps rotation

    def _hold_off(self, replica: _Replica) -> None:
        with self._lock:
            replica.held_off_until = time.monotonic() + REPLICA_HOLD_OFF_S

    def _checkin(self, replica: _Replica, exchange: StreamExchange) -> None:
        with self._lock:
            current = replica in self._replicas
        if current:
            replica.streams.checkin(exchange)
        else:  # the replica left the set while this call ran
            replica.streams.discard(exchange)

    def _receive(self, replica: _Replica, exchange: StreamExchange) -> draft_pb2.ProposeResponse:
        """The next response on `exchange`, cancelled by the watchdog past the draft timeout."""
        ticket = self._watchdog.watch(exchange, remaining_time(self.timeout_s))
        try:
            return exchange.receive(f"draft service {replica.address}")
        finally:
            self._watchdog.done(ticket)

    def _propose_on(
        self, replica: _Replica, request: draft_pb2.ProposeRequest
    ) -> draft_pb2.ProposeResponse:
        """The replica's answer: on a pooled stream, or by unary Propose when it takes none."""
        exchange = replica.streams.checkout()
        if exchange is None:
            return self._propose_unary(replica, request)
        exchange.send(request)
        try:
            response = self._receive(replica, exchange)
        except RemoteError as exc:
            if not _refused(exc, exchange):
                replica.streams.discard(exchange)
                raise
            replica.streams.refused(exchange)
            return self._propose_unary(replica, request)
        except UnavailableError:
            replica.streams.discard(exchange)
            raise
        self._checkin(replica, exchange)
        return response

    def _propose_unary(
        self, replica: _Replica, request: draft_pb2.ProposeRequest
    ) -> draft_pb2.ProposeResponse:
        try:
            return replica.stub.Propose(
                request, timeout=remaining_time(self.timeout_s), metadata=request_metadata()
            )
        except grpc.RpcError as exc:
            raise RemoteError.from_rpc_error(exc, f"draft service {replica.address}") from exc

    def propose(
        self, context_ids: Sequence[int], params: DraftParams, seed: int | None = None
    ) -> DraftProposal:
        return self._propose(propose_request(context_ids, params, seed))

    def _propose(
        self, request: draft_pb2.ProposeRequest, skip: _Replica | None = None
    ) -> DraftProposal:
        """Ask each replica in turn (but `skip`) until one answers."""
        last_error: Exception | None = None
        for replica in self._replica_order():
            if replica is skip:
                continue
            try:
                response = self._propose_on(replica, request)
                return proposal_from_message(response, _is_greedy(request))
            except (RemoteError, UnavailableError) as exc:
                last_error = exc
                self._hold_off(replica)
                log.debug("draft replica %s failed: %s", replica.address, exc)
        if last_error is None:
            raise UnavailableError("no other draft service replica to ask")
        raise last_error

    def start(
        self,
        context_ids: Sequence[int],
        params: DraftParams,
        seed: int | None,
        next_round_drafts: int,
        next_round_seed: int | None,
        draft_known: bool = False,
    ) -> GrpcDraftCall | UnaryDraftCall:
        """Send a ProposeRequest that also asks for next-round drafts; return at once.
        draft_known: the caller holds this draft already; only the next-round drafts come.
        Without a stream to the replica (it takes none now), the draft comes by unary Propose
        when asked for, without next-round drafts."""
        request = propose_request(context_ids, params, seed)
        replica = self._replica_order()[0]
        exchange = replica.streams.checkout()
        if exchange is None:
            return UnaryDraftCall(self, request, draft_known)
        if next_round_drafts > 0:
            request.next_round_drafts = next_round_drafts
            request.next_round_only = draft_known
            if next_round_seed is not None:
                request.next_round_seed = next_round_seed
        exchange.send(request)
        return GrpcDraftCall(self, replica, exchange, request)

    def learn(
        self, token_ids: Sequence[int], generation_id: str, timeout_s: float = LEARN_TIMEOUT_S
    ) -> LearnDelivery:
        """Report a finished generation to every current replica (each learns it), asking
        exactly one to persist it: the first that answers, in round-robin order. Never raises:
        failures are counted in the result."""
        request = draft_pb2.LearnRequest(token_ids=token_ids, generation_id=generation_id)
        delivery = LearnDelivery()
        for replica in self._replica_order():
            request.persist = not delivery.persisted_by
            try:
                response = replica.stub.Learn(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                delivery.failed.append(replica.address)
                log.debug("learn report to %s failed: %s", replica.address, exc)
                continue
            delivery.delivered.append(replica.address)
            if response.persisted:
                delivery.persisted_by = replica.address
        return delivery

    def graph_info(self, timeout_s: float = 5.0) -> draft_pb2.GetGraphInfoResponse:
        """The graph meta of the first replica that answers (each asked within timeout_s)."""
        last_error: grpc.RpcError | None = None
        for replica in self._replica_order():
            try:
                return replica.stub.GetGraphInfo(
                    draft_pb2.GetGraphInfoRequest(), timeout=timeout_s, metadata=request_metadata()
                )
            except grpc.RpcError as exc:
                last_error = exc
        raise UnavailableError(
            f"no draft service answers at {', '.join(self.addresses)}: "
            f"{last_error.details() if last_error else ''}"
        )


def proposal_from_message(
    message: draft_pb2.ProposeResponse | draft_pb2.NextRoundDraft, greedy: bool
) -> DraftProposal:
    """The DraftProposal in a ProposeResponse or a NextRoundDraft. Greedy drafts' q's are point
    masses at their tokens, which the verifier assumes anyway: not decoded (distributions=[])."""
    return DraftProposal(
        token_ids=list(message.draft_token_ids),
        distributions=[]
        if greedy
        else [
            SparseDistribution(np.asarray(d.token_ids, dtype=np.int64), np.asarray(d.probs))
            for d in message.distributions
        ],
        matched_orders=list(message.matched_orders),
        sources=list(message.draft_sources),
        parents=list(getattr(message, "draft_parents", ())),
    )


class UnaryDraftCall:
    """A DraftCall (see gateway.interfaces) without a stream: the draft by unary Propose when
    asked for (any replica, failing over), no next-round drafts."""

    def __init__(
        self, client: GrpcDraftClient, request: draft_pb2.ProposeRequest, draft_known: bool
    ) -> None:
        self._client = client
        self._request = request
        self._draft_known = draft_known

    def proposal(self) -> DraftProposal:
        if self._draft_known:
            raise ValueError("this call was made for next-round drafts only")
        return self._client._propose(self._request)

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
        client: GrpcDraftClient,
        replica: _Replica,
        exchange: StreamExchange,
        request: draft_pb2.ProposeRequest,
    ) -> None:
        self._client = client
        self._replica = replica
        self._exchange: StreamExchange | None = exchange
        self._request = request
        self._greedy = _is_greedy(request)
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
                response = self._client._receive(self._replica, exchange)
                self._draft = proposal_from_message(response, self._greedy)
            except (RemoteError, UnavailableError) as exc:
                request = self._request_without_next_round()
                if isinstance(exc, RemoteError) and exchange and _refused(exc, exchange):
                    self._exchange = None
                    self._replica.streams.refused(exchange)
                    self._expects_next_round = False
                    self._draft = self._client._propose(request)
                    return self._draft
                self.discard()
                self._client._hold_off(self._replica)
                log.debug("draft replica %s failed: %s", self._replica.address, exc)
                self._draft = self._client._propose(request, skip=self._replica)
            else:
                self._finish_unless_next_round()
        return self._draft

    def next_round(self) -> list[NextRoundDraft]:
        if self._exchange is None or not self._expects_next_round:
            return []
        try:
            if self._expects_draft and self._draft is None:  # the draft's response comes first
                first = self._client._receive(self._replica, self._exchange)
                self._draft = proposal_from_message(first, self._greedy)
            response = self._client._receive(self._replica, self._exchange)
        except (RemoteError, UnavailableError) as exc:
            log.debug("no next-round drafts: %s", exc)
            self.discard()
            return []
        self._expects_next_round = False
        self._finish_unless_next_round()
        return [
            NextRoundDraft(
                d.accepted_count, d.next_token_id, proposal_from_message(d, self._greedy)
            )
            for d in response.next_round
        ]

    def discard(self) -> None:
        if self._exchange is not None:
            self._replica.streams.discard(self._exchange)
            self._exchange = None

    def _finish_unless_next_round(self) -> None:
        if self._exchange is not None and not self._expects_next_round:
            self._client._checkin(self._replica, self._exchange)
            self._exchange = None

    def _request_without_next_round(self) -> draft_pb2.ProposeRequest:
        request = draft_pb2.ProposeRequest()
        request.CopyFrom(self._request)
        request.ClearField("next_round_drafts")
        request.ClearField("next_round_seed")
        return request


# The most a verifier call, or one step of a Session stream, waits for its answer (a verifier that
# answers its keepalive pings but not the call: stuck, not frozen).
DEFAULT_VERIFIER_TIMEOUT_S = 60.0


class GrpcVerifierClient:
    """The verifier service: one open Session stream per generation (prefill, then verifies);
    closing it releases the session on the verifier.

    Bounds: every call and every step on a Session stream waits at most ``timeout_s`` for its
    answer (then UNAVAILABLE: the verifier does not answer), and the channel's keepalive fails
    every call within about 10 s once the verifier stops answering pings (frozen, host gone;
    see speculant.grpc_server.KEEPALIVE_TIME_MS)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S,
        session_timeout_s: float = 3600.0,
        tls: ClientTls | None = None,
    ) -> None:
        """tls: connect over TLS (see speculant.tls), else plaintext."""
        self.address = address
        self.timeout_s = timeout_s
        self.session_timeout_s = session_timeout_s
        self._channel = _channel(address, tls)
        self._stub = verifier_pb2_grpc.VerifierServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._watchdog = _Watchdog(tick_s=0.1, name="verifier-watchdog")
        self._info: ModelInfo | None = None
        self._sessions: dict[str, StreamExchange] = {}
        self._lock = threading.Lock()

    def health(self, timeout_s: float) -> str:
        """The verifier's health status name (SERVING, NOT_SERVING) or the status code of the
        failed check (UNAVAILABLE, DEADLINE_EXCEEDED, ...)."""
        try:
            response = self._health.Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc.code().name
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def _step(self, stream: StreamExchange, request: object, what: str) -> object:
        """One request and its answer on a Session stream, within timeout_s."""
        ticket = self._watchdog.watch(stream, self.timeout_s)
        try:
            stream.send(request)
            return stream.receive(what)
        except RemoteError:
            if self._watchdog.done(ticket):
                raise
            raise UnavailableError(
                f"{what}: the verifier at {self.address} did not answer within {self.timeout_s:g} s"
            ) from None
        finally:
            self._watchdog.done(ticket)

    def _call(self, method: str, request: object, timeout: float | None = None) -> object:
        try:
            return getattr(self._stub, method)(
                request,
                timeout=remaining_time(timeout or self.timeout_s),
                metadata=request_metadata(),
            )
        except grpc.RpcError as exc:
            raise RemoteError.from_rpc_error(exc, f"verifier {method}") from exc

    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            r = self._call("GetModelInfo", verifier_pb2.GetModelInfoRequest(), timeout=10.0)
            self._info = ModelInfo(
                model_name=r.model_name,
                tokenizer_name=r.tokenizer_name,
                tokenizer_fingerprint=r.tokenizer_fingerprint,
                vocab_size=r.vocab_size,
                eos_token_ids=list(r.eos_token_ids),
                max_context_length=r.max_context_length,
                device=r.device,
                dtype=r.dtype,
            )
        return self._info

    def forget_info(self) -> None:
        """Drop the cached model info (asked again on next use, e.g. after a restart)."""
        self._info = None

    def prefill(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> int:
        stream = StreamExchange(
            self._stub.Session,
            timeout_s=remaining_time(self.session_timeout_s),
            metadata=request_metadata(),
        )
        with self._lock:
            self._sessions[session_id] = stream
        request = verifier_pb2.SessionRequest(
            prefill=verifier_pb2.PrefillRequest(
                session_id=session_id,
                prompt_token_ids=prompt_ids,
                temperature=temperature,
                seed=seed,
            )
        )
        try:
            return self._step(stream, request, "verifier Prefill").prefill.token_id
        except Exception:
            self.release(session_id)
            raise

    def verify(
        self,
        session_id: str,
        draft_ids: Sequence[int],
        draft_distributions: Sequence[SparseDistribution] | None = None,
        draft_parents: Sequence[int] | None = None,
    ) -> VerifyResult:
        with self._lock:
            stream = self._sessions.get(session_id)
        if stream is None:
            raise NotFoundError(f"no open verifier session {session_id!r}")
        request = verifier_pb2.SessionRequest(
            verify=verifier_pb2.VerifyRequest(
                draft_token_ids=draft_ids,
                draft_distributions=[
                    common_pb2.SparseDistribution(
                        token_ids=d.token_ids.tolist(), probs=d.probs.tolist()
                    )
                    for d in draft_distributions or ()
                ],
                draft_parents=draft_parents or (),
            )
        )
        response = self._step(stream, request, "verifier Verify").verify
        return VerifyResult(
            response.accepted_count,
            list(response.token_ids),
            list(response.accepted_draft_indices),
        )

    def release(self, session_id: str) -> bool:
        """End the session's stream; the verifier frees the session as the stream ends."""
        with self._lock:
            stream = self._sessions.pop(session_id, None)
        if stream is None:
            return False
        if stream.broken:
            stream.cancel()
        else:
            stream.close()
        return True
