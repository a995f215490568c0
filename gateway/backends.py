"""The gateway's gRPC clients of its backends: the drafter (:class:`GrpcDraftClient`, over the
draft-service replicas) and the verifier (:class:`GrpcVerifierClient`), and the channels and
streams they share.

Channels and streams, and their upkeep: the channel every gateway client
opens to a backend (:func:`backend_channel`: shared options, fast reconnects); an open
bidirectional stream used as request -> response (:class:`StreamExchange`); a watchdog that
cancels a stream read outliving its deadline (a client request's, speculant.request_context);
and the pools of open streams kept for reuse, one a backend, within what the backend accepts.

Pools. A backend serves each open stream on one of its worker threads for as long as the
stream is open, idle or not, and refuses a new stream with RESOURCE_EXHAUSTED once it serves its
limit (speculant.grpc_server.CallLimit). A pool therefore

- reuses the most recently returned idle stream first (so under a steady load the streams
  beyond what the load needs stay idle and age out),
- closes a stream idle for longer than ``idle_s`` (its backend thread is free again for other
  clients: another gateway, after a burst),
- after a refusal, opens no stream beyond those it holds for ``refused_retry_s`` (its callers use
  a unary call instead; checkout returns None), then tries again.

The verifier client: one open Session stream per generation (prefill, then
verifies); closing it releases the session on the verifier.

The draft client: drafts from one or more draft-service replicas over
open ProposeStreams, and reports what was generated (Learn), off the request's path.

Replicas: the addresses given, ``dns:NAME:PORT`` entries expanded to one replica per address
(:func:`expand_addresses`, resolved again every refresh interval); each replica (:class:`Replica`)
has its stub, its pool of open streams and its hold-off after a failure.

Online learning: the coordinator hands each finished generation's tokens (prompt and output) to a
:class:`LearnReporter`, which queues them and returns at once; one background thread sends each
to every draft replica (``GrpcDraftClient.learn``: all replicas learn it, one persists it). A
full queue drops the newest report, a failed call is logged at DEBUG and counted: learning is an
optimisation, so a report never fails, delays or slows a request.

Why so long: the two clients are short and share every piece of the stream machinery (pools,
exchanges, the watchdog, the channel options); in one room a reader sees a hop whole.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speculant.auth import bearer_metadata
from speculant.config import (
    DEFAULT_DRAFT_REFRESH_S,
    DEFAULT_MAX_CONTEXT_TOKENS,
    DraftParams,
    SessionOptions,
)
from speculant.errors import InvalidArgumentError, NotFoundError, RemoteError, UnavailableError
from speculant.grpc_server import CLIENT_KEEPALIVE_OPTIONS, GRPC_OPTIONS
from speculant.request_context import REQUEST_ID, remaining_time, request_metadata
from speculant.tls import ClientTls, open_channel
from speculant.types import DraftProposal, DraftTarget, ModelInfo, SparseDistribution, VerifyResult
from speculant.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    draft_pb2,
    draft_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from speculant.wire import (
    is_greedy_request,
    logprobs_from_pb,
    model_info_from_pb,
    prefill_request_to_pb,
    proposal_from_pb,
    propose_request_to_pb,
    sparse_to_pb,
    verify_result_from_pb,
)

IDLE_STREAM_S = 5.0  # an idle stream is closed after this long
REFUSED_RETRY_S = 5.0  # after a refusal, no new stream beyond those held for this long
CLOSE_WAIT_S = 0.5  # how long closing an idle stream waits for the backend to end it


# Reconnect quickly after a backend restarts (gRPC's default backoff starts at 1 s, up to 120 s).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def backend_channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    """The channel a gateway client opens to a backend: shared options, fast reconnects."""
    return open_channel(address, tls, GRPC_OPTIONS + RECONNECT_OPTIONS + CLIENT_KEEPALIVE_OPTIONS)


_END_OF_STREAM = object()


class StreamExchange:
    """One open bidirectional stream used as request -> response, one exchange at a time.

    Keeping the stream open saves the set-up of a unary call on every round (about half the
    cost of a round trip on loopback). Not thread-safe: one caller at a time.
    """

    def __init__(
        self,
        method: grpc.StreamStreamMultiCallable,
        timeout_s: float | None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._responses = method(
            iter(self._requests.get, _END_OF_STREAM), timeout=timeout_s, metadata=metadata or None
        )
        self.broken = False
        self.responses = 0  # received so far

    def call(self, request: object, backend: str) -> object:
        """Send one request and wait for the next response."""
        self.send(request)
        return self.receive(backend)

    def send(self, request: object) -> None:
        """Queue one request on the stream (returns at once; errors surface in receive)."""
        self._requests.put(request)

    def receive(self, backend: str) -> object:
        """Wait for the next response; RemoteError / UnavailableError naming `backend`."""
        try:
            response = next(self._responses)
        except grpc.RpcError as exc:
            self.broken = True
            raise RemoteError.from_rpc_error(exc, backend) from exc
        except StopIteration:
            self.broken = True
            raise UnavailableError(f"{backend}: the stream ended unexpectedly") from None
        self.responses += 1
        return response

    def cancel(self) -> None:
        """Abort the stream (the next or current call raises CANCELLED)."""
        self.broken = True
        self._responses.cancel()

    def close(self, wait_s: float = 5.0) -> None:
        """End the request stream and wait (up to wait_s, then cancel) for the server to end
        the call: its side is finished, and what it held freed, when this returns. (A call
        dropped before its end would also be cancelled by gRPC, and the server would see
        CANCELLED instead of a normal end.)"""
        self._requests.put(_END_OF_STREAM)
        try:
            self._responses.exception(timeout=wait_s)
        except grpc.FutureTimeoutError:
            self.cancel()
        except grpc.FutureCancelledError:
            pass


class StreamWatchdog:
    """Cancels stream exchanges that run past their deadline (streams have no per-message
    timeout). One thread, waking every `tick_s` while calls are in flight and for `linger_s`
    after the last one, then parked until the next: a caller wakes it only from there, so the
    exchanges of a running generation start without waking it (a thread switch on the path)."""

    def __init__(
        self, tick_s: float = 0.01, name: str = "draft-watchdog", linger_s: float = 1.0
    ) -> None:
        self._tick_s = tick_s
        self._linger_s = linger_s
        self._in_flight: dict[int, tuple[float, StreamExchange]] = {}
        self._lock = threading.Condition()
        self._parked = False
        self._last_watch = 0.0  # time.monotonic() of the last watch
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def watch(self, exchange: StreamExchange, timeout_s: float) -> int:
        now = time.monotonic()
        with self._lock:
            ticket = id(exchange)
            self._in_flight[ticket] = (now + timeout_s, exchange)
            self._last_watch = now
            if self._parked:
                self._lock.notify()
            return ticket

    def done(self, ticket: int) -> bool:
        """The exchange is answered (or failed); False when the watchdog had cancelled it."""
        with self._lock:
            return self._in_flight.pop(ticket, None) is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                if not self._in_flight and now - self._last_watch > self._linger_s:
                    self._parked = True
                    while not self._in_flight:
                        self._lock.wait()
                    self._parked = False
                    now = time.monotonic()
                late = [t for t, (deadline, _) in self._in_flight.items() if deadline < now]
                for ticket in late:
                    self._in_flight.pop(ticket)[1].cancel()
            time.sleep(self._tick_s)


class StreamPool:
    """One backend's open streams (see the module docstring). Thread-safe."""

    def __init__(
        self,
        open_stream: Callable[[], StreamExchange],
        idle_s: float = IDLE_STREAM_S,
        refused_retry_s: float = REFUSED_RETRY_S,
    ) -> None:
        self._open_stream = open_stream
        self.idle_s = idle_s
        self.refused_retry_s = refused_retry_s
        self._lock = threading.Lock()
        self._idle: list[tuple[StreamExchange, float]] = []  # (stream, idle since), oldest first
        self._open = 0  # streams opened and not yet closed: idle or in use
        self._budget = 0  # after a refusal: streams the backend accepted from this pool
        self._budget_until = 0.0  # time.monotonic() until which the budget holds
        self.refusals = 0

    @property
    def open_streams(self) -> int:
        return self._open

    def checkout(self) -> StreamExchange | None:
        """An idle stream, else a new one; None when the backend refused a stream recently
        and this pool holds as many as it accepted (use a unary call)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()[0]
            if self._open >= self._budget and time.monotonic() < self._budget_until:
                return None
            self._open += 1
        try:
            return self._open_stream()
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def checkin(self, exchange: StreamExchange) -> None:
        """Return a healthy stream after a complete exchange."""
        with self._lock:
            self._idle.append((exchange, time.monotonic()))

    def discard(self, exchange: StreamExchange) -> None:
        """Drop a stream taken with checkout that failed or is abandoned (cancelled)."""
        exchange.cancel()
        with self._lock:
            self._open -= 1

    def refused(self, exchange: StreamExchange) -> None:
        """The backend refused this new stream (it serves its limit): hold no more than the
        others for refused_retry_s."""
        with self._lock:
            self._open -= 1
            self._budget = self._open
            self._budget_until = time.monotonic() + self.refused_retry_s
            self.refusals += 1

    def trim(self, now: float | None = None) -> int:
        """Close the streams idle for longer than idle_s; return how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            stale = [e for e, since in self._idle if now - since > self.idle_s]
            self._idle = [(e, since) for e, since in self._idle if now - since <= self.idle_s]
            self._open -= len(stale)
        for exchange in stale:
            with contextlib.suppress(Exception):
                exchange.close(CLOSE_WAIT_S)
        return len(stale)

    def close(self) -> None:
        """Close every idle stream (streams in use are closed by their callers)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for exchange, _ in idle:
            with contextlib.suppress(Exception):
                exchange.close(CLOSE_WAIT_S)


log = logging.getLogger(__name__)


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
        self.backend_channel = backend_channel(address, tls)
        self._stub = verifier_pb2_grpc.VerifierServiceStub(self.backend_channel)
        self._health = health_pb2_grpc.HealthStub(self.backend_channel)
        self._watchdog = StreamWatchdog(tick_s=0.1, name="verifier-watchdog")
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
            self._info = model_info_from_pb(r)
        return self._info

    def forget_info(self) -> None:
        """Drop the cached model info (asked again on next use, e.g. after a restart)."""
        self._info = None

    def start(
        self, session_id: str, prompt_ids: Sequence[int], options: SessionOptions
    ) -> VerifyResult:
        stream = StreamExchange(
            self._stub.Session,
            timeout_s=remaining_time(self.session_timeout_s),
            metadata=request_metadata(),
        )
        with self._lock:
            self._sessions[session_id] = stream
        request = verifier_pb2.SessionRequest(
            prefill=prefill_request_to_pb(session_id, prompt_ids, options)
        )
        try:
            response = self._step(stream, request, "verifier Prefill").prefill
            return VerifyResult(
                0, [response.token_id], logprobs=logprobs_from_pb(response.logprobs)
            )
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
                draft_distributions=[sparse_to_pb(d) for d in draft_distributions or ()],
                draft_parents=draft_parents or (),
            )
        )
        return verify_result_from_pb(self._step(stream, request, "verifier Verify").verify)

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


log = logging.getLogger(__name__)


LEARN_TIMEOUT_S = 2.0  # one Learn report to one draft replica (off the request's path)
ADMIN_TIMEOUT_S = 30.0  # one AdminService call to one draft replica (opening a graph)
DEFAULT_QUEUE = 1024  # Learn reports waiting to be sent; more are dropped


@dataclass
class LearnDelivery:
    """Where one Learn report went: the replicas that took it, failed, and persisted it."""

    delivered: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    persisted_by: str = ""


def propose_request(
    context_ids: Sequence[int],
    params: DraftParams,
    seed: int | None,
    target: DraftTarget | None = None,
) -> draft_pb2.ProposeRequest:
    """The ProposeRequest for one drafting call made for the request being served: the context's
    last DEFAULT_MAX_CONTEXT_TOKENS tokens (all a replica takes), named by the request's id,
    drafting from target's graph for its tenant (None: the default graph and tenant)."""
    tail = context_ids[-DEFAULT_MAX_CONTEXT_TOKENS:]
    return propose_request_to_pb(tail, params, seed, REQUEST_ID.get() or "", target)


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
class Replica:
    """One draft service: its stub, its open streams, and its hold-off after a failure."""

    address: str
    stub: draft_pb2_grpc.DraftServiceStub
    streams: StreamPool
    admin: admin_pb2_grpc.AdminServiceStub | None = None  # its catalog (AdminService)
    held_off_until: float = 0.0  # time.monotonic()

    @classmethod
    def connect(cls, address: str, tls: ClientTls | None) -> Replica:
        channel = backend_channel(address, tls)
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        return cls(
            address,
            stub,
            StreamPool(lambda: StreamExchange(stub.ProposeStream, None)),
            admin_pb2_grpc.AdminServiceStub(channel),
        )


def stream_refused(exc: RemoteError, exchange: StreamExchange) -> bool:
    """Whether a stream failed because the service refused it (it serves its limit of streams,
    see speculant.grpc_server.CallLimit), not because of the request or the service."""
    return exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and exchange.responses == 0


class GrpcDraftClient:
    """Drafts from one or more draft-service replicas over open streams (ProposeStream), round
    robin, failing over to the next replica on an error or a timeout. A replica that failed goes
    to the back of the order for REPLICA_HOLD_OFF_S (a passive health check), so a dead replica
    costs one failed call per hold-off, not one per round.

    The replica set can change while calls run (``refresh``): with ``dns:NAME:PORT`` entries
    (see expand_addresses) a background thread resolves them again every ``refresh_s`` seconds,
    so replicas a scaler adds are used and removed ones are dropped without a restart.

    Streams: each replica's open streams are pooled (gateway.backends): idle ones are
    closed after a few seconds, and a replica that refuses a new stream (it serves its limit: each
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
        self._replicas: list[Replica] = []
        self._turn = itertools.count()
        self._watchdog = StreamWatchdog()
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
            replicas = [known.get(a) or Replica.connect(a, self._tls) for a in addresses]
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

    def _replica_order(self) -> list[Replica]:
        """Round robin, replicas held off after a failure last."""
        with self._lock:
            replicas = self._replicas
            first = next(self._turn) % len(replicas)
        order = replicas[first:] + replicas[:first]
        now = time.monotonic()
        return sorted(order, key=lambda r: r.held_off_until > now)  # stable: keeps rotation

    def hold_off(self, replica: Replica) -> None:
        with self._lock:
            replica.held_off_until = time.monotonic() + REPLICA_HOLD_OFF_S

    def check_in(self, replica: Replica, exchange: StreamExchange) -> None:
        with self._lock:
            current = replica in self._replicas
        if current:
            replica.streams.checkin(exchange)
        else:  # the replica left the set while this call ran
            replica.streams.discard(exchange)

    def receive(self, replica: Replica, exchange: StreamExchange) -> draft_pb2.ProposeResponse:
        """The next response on `exchange`, cancelled by the watchdog past the draft timeout."""
        ticket = self._watchdog.watch(exchange, remaining_time(self.timeout_s))
        try:
            return exchange.receive(f"draft service {replica.address}")
        finally:
            self._watchdog.done(ticket)

    def _propose_on(
        self, replica: Replica, request: draft_pb2.ProposeRequest
    ) -> draft_pb2.ProposeResponse:
        """The replica's answer: on a pooled stream, or by unary Propose when it takes none."""
        exchange = replica.streams.checkout()
        if exchange is None:
            return self._propose_unary(replica, request)
        exchange.send(request)
        try:
            response = self.receive(replica, exchange)
        except RemoteError as exc:
            if not stream_refused(exc, exchange):
                replica.streams.discard(exchange)
                raise
            replica.streams.refused(exchange)
            return self._propose_unary(replica, request)
        except UnavailableError:
            replica.streams.discard(exchange)
            raise
        self.check_in(replica, exchange)
        return response

    def _propose_unary(
        self, replica: Replica, request: draft_pb2.ProposeRequest
    ) -> draft_pb2.ProposeResponse:
        try:
            return replica.stub.Propose(
                request, timeout=remaining_time(self.timeout_s), metadata=request_metadata()
            )
        except grpc.RpcError as exc:
            raise RemoteError.from_rpc_error(exc, f"draft service {replica.address}") from exc

    def propose(
        self,
        context_ids: Sequence[int],
        params: DraftParams,
        seed: int | None = None,
        target: DraftTarget | None = None,
    ) -> DraftProposal:
        return self.propose_message(propose_request(context_ids, params, seed, target))

    def propose_message(
        self, request: draft_pb2.ProposeRequest, skip: Replica | None = None
    ) -> DraftProposal:
        """Ask each replica in turn (but `skip`) until one answers."""
        last_error: Exception | None = None
        for replica in self._replica_order():
            if replica is skip:
                continue
            try:
                response = self._propose_on(replica, request)
                return proposal_from_pb(response, is_greedy_request(request))
            except (RemoteError, UnavailableError) as exc:
                last_error = exc
                self.hold_off(replica)
                log.debug("draft replica %s failed: %s", replica.address, exc)
        if last_error is None:
            raise UnavailableError("no other draft service replica to ask")
        raise last_error

    def learn(
        self,
        token_ids: Sequence[int],
        generation_id: str,
        timeout_s: float = LEARN_TIMEOUT_S,
        target: DraftTarget | None = None,
    ) -> LearnDelivery:
        """Report a finished generation (drafted from target's graph, for its tenant) to every
        current replica (each learns it), asking exactly one to persist it: the first that
        answers, in round-robin order. Never raises: failures are counted in the result."""
        target = target or DraftTarget()
        request = draft_pb2.LearnRequest(
            token_ids=token_ids,
            generation_id=generation_id,
            graph=target.graph,
            tenant=target.tenant,
        )
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

    def bind(self, target: DraftTarget) -> TargetedDrafts:
        """The drafter of one request: target's graph and tenant (see TargetedDrafts)."""
        return TargetedDrafts(self, target)

    def graph_info(self, timeout_s: float = 5.0, graph: str = "") -> draft_pb2.GetGraphInfoResponse:
        """The meta of a graph (empty: the default one) from the first replica that answers
        (each asked within timeout_s); NotFoundError when it serves no such graph."""
        last_error: grpc.RpcError | None = None
        for replica in self._replica_order():
            try:
                return replica.stub.GetGraphInfo(
                    draft_pb2.GetGraphInfoRequest(graph=graph),
                    timeout=timeout_s,
                    metadata=request_metadata(),
                )
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    raise NotFoundError(exc.details()) from exc
                last_error = exc
        raise UnavailableError(
            f"no draft service answers at {', '.join(self.addresses)}: "
            f"{last_error.details() if last_error else ''}"
        )

    # -- the catalog (AdminService on every replica) ---------------------------------------

    def add_graph(
        self, name: str, path: str, token: str | None, timeout_s: float = ADMIN_TIMEOUT_S
    ) -> admin_pb2.AddGraphResponse:
        """AddGraph on every current replica. The first that answers decides: its refusal (a
        bad graph, another tokenizer) is raised and no other replica is asked, so the catalog
        stays unchanged; a later replica that fails is logged (it applies the change from the
        catalog file the replicas share)."""
        request = admin_pb2.AddGraphRequest(name=name, path=path)
        return self._admin_everywhere("AddGraph", request, token, timeout_s)

    def remove_graph(
        self, name: str, token: str | None, timeout_s: float = ADMIN_TIMEOUT_S
    ) -> admin_pb2.RemoveGraphResponse:
        """RemoveGraph on every current replica (as add_graph)."""
        request = admin_pb2.RemoveGraphRequest(name=name)
        return self._admin_everywhere("RemoveGraph", request, token, timeout_s)

    def list_graphs(
        self, token: str | None, timeout_s: float = ADMIN_TIMEOUT_S
    ) -> admin_pb2.ListGraphsResponse:
        """ListGraphs of the first replica that answers."""
        request = admin_pb2.ListGraphsRequest()
        return self._admin_everywhere("ListGraphs", request, token, timeout_s, first_only=True)

    def _admin_everywhere(
        self,
        method: str,
        request: object,
        token: str | None,
        timeout_s: float,
        first_only: bool = False,
    ):
        """The answer of the first replica that answers `method`; the others are asked too
        (unless first_only) and their failures logged. UnavailableError when none answers;
        a replica's refusal as its status (RemoteError)."""
        metadata = (*request_metadata(), *bearer_metadata(token))
        answer = None
        last_error: grpc.RpcError | None = None
        for replica in self._replica_order():
            assert replica.admin is not None
            try:
                response = getattr(replica.admin, method)(
                    request, timeout=timeout_s, metadata=metadata
                )
            except grpc.RpcError as exc:
                if answer is not None:
                    log.warning("%s on draft replica %s failed: %s", method, replica.address, exc)
                    continue
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise RemoteError(exc.code(), exc.details() or str(exc)) from exc
                last_error = exc
                continue
            if answer is None:
                answer = response
                if first_only:
                    break
        if answer is None:
            raise UnavailableError(
                f"no draft service answers at {', '.join(self.addresses)}: "
                f"{last_error.details() if last_error else ''}"
            )
        return answer


class TargetedDrafts:
    """The draft tier as one request drafts from it: its graph and tenant, pinned from its first
    draft on to the build of the graph that draft came from (ProposeRequest.graph_id), so the
    request finishes on the graph it began with. The coordinator's drafter for that request."""

    def __init__(self, client: GrpcDraftClient, target: DraftTarget) -> None:
        self.client = client
        self.target = target

    def propose(
        self, context_ids: Sequence[int], params: DraftParams, seed: int | None = None
    ) -> DraftProposal:
        return self.pin(self.client.propose(context_ids, params, seed, self.target))

    def pin(self, proposal: DraftProposal) -> DraftProposal:
        """Pin the request to the build its first draft came from."""
        if proposal.graph_id and not self.target.graph_id:
            self.target = replace(self.target, graph_id=proposal.graph_id)
        return proposal

    def close(self) -> None:
        pass


@dataclass
class ReporterCounts:
    """Reports queued, sent (taken by at least one replica), failed (by every replica), and
    dropped because the queue was full."""

    queued: int = 0
    sent: int = 0
    failed: int = 0
    dropped: int = 0


class LearnReporter:
    """Sends finished generations to the draft tier in the background (see the module)."""

    def __init__(self, drafter: GrpcDraftClient, *, queue_size: int = DEFAULT_QUEUE) -> None:
        self.drafter = drafter
        self.counts = ReporterCounts()
        self._queue: queue.Queue[tuple[str, list[int], DraftTarget] | None] = queue.Queue(
            queue_size
        )
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="learn-reporter", daemon=True)
        self._thread.start()

    def learn(self, token_ids: Sequence[int], target: DraftTarget | None = None) -> None:
        """Queue one finished generation's tokens, drafted from target's graph for its tenant
        (None: the default graph and tenant); returns at once."""
        with self._idle:
            try:
                self._queue.put_nowait((uuid.uuid4().hex, list(token_ids), target or DraftTarget()))
            except queue.Full:
                self.counts.dropped += 1
                return
            self._pending += 1
            self.counts.queued += 1

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued report was sent (tests, graceful shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (for up to timeout_s), then stop the thread."""
        self.wait_idle(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            generation_id, token_ids, target = item
            try:
                delivery = self.drafter.learn(token_ids, generation_id, target=target)
                if delivery.delivered:
                    self.counts.sent += 1
                else:
                    self.counts.failed += 1
                    log.debug("no draft replica took learn report %s", generation_id)
            except Exception as exc:  # never let the thread die
                self.counts.failed += 1
                log.warning("learn report %s not sent: %s", generation_id, exc)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
