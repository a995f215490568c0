"""Channels and streams to the backends and their upkeep: the channel every gateway client
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
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable

import grpc

from speculant.errors import RemoteError, UnavailableError
from speculant.grpc_server import CLIENT_KEEPALIVE_OPTIONS, GRPC_OPTIONS
from speculant.tls import ClientTls, open_channel

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

    @property
    def idle_streams(self) -> int:
        return len(self._idle)

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
