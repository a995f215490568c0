"""The gRPC verifier of the coordinator: one open Session stream per generation (prefill, then
verifies); closing it releases the session on the verifier."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.backends.streams import (
    StreamExchange,
    StreamWatchdog,
    backend_channel,
)
from speculant.errors import NotFoundError, RemoteError, UnavailableError
from speculant.request_context import remaining_time, request_metadata
from speculant.sampling_controls import SessionOptions
from speculant.tls import ClientTls
from speculant.types import ModelInfo, SparseDistribution, VerifyResult
from speculant.v1 import (
    verifier_pb2,
    verifier_pb2_grpc,
)
from speculant.wire import (
    logprobs_from_pb,
    model_info_from_pb,
    prefill_request_to_pb,
    sparse_to_pb,
    verify_result_from_pb,
)

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
