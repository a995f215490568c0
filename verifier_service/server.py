"""The verifier's gRPC service: a thin servicer over :class:`LocalVerifier`, and its server."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc
import torch

from speculant.config import VerifierConfig
from speculant.errors import InvalidArgumentError, UnavailableError
from speculant.grpc_server import (
    RESERVED_THREADS,
    CallLimit,
    ServiceServer,
    map_errors,
    map_stream_errors,
)
from speculant.metrics import Metrics
from speculant.tls import ServerTls
from speculant.v1 import verifier_pb2, verifier_pb2_grpc
from speculant.wire import (
    logprobs_to_pb,
    model_info_to_pb,
    session_options_from_pb,
    sparse_from_pb,
    verifier_stats_to_pb,
    verify_result_to_pb,
)
from verifier_service.metrics import VerifierCollector
from verifier_service.verifier import LocalVerifier, new_session_id

log = logging.getLogger(__name__)

SERVICE_NAME = verifier_pb2.DESCRIPTOR.services_by_name["VerifierService"].full_name


class VerifierServicer(verifier_pb2_grpc.VerifierServiceServicer):
    """speculant.v1.VerifierService over an in-process verifier; errors map to status codes.

    Created before the model is loaded (``verifier=None``): calls then get UNAVAILABLE, as the
    health service says NOT_SERVING, until :attr:`verifier` is set.

    Threads (see speculant.grpc_server.CallLimit): at most `max_streams` Session streams are
    open at once (each holds a worker thread while open) and at most `max_unary_model_calls`
    unary Prefill / Verify calls (which may wait for the model) run at once; more are refused
    with RESOURCE_EXHAUSTED, so the server's other threads always answer health checks,
    GetStats, GetModelInfo and Release.
    """

    def __init__(
        self,
        verifier: LocalVerifier | None = None,
        *,
        max_streams: int = 64,
        max_unary_model_calls: int = RESERVED_THREADS // 2,
    ) -> None:
        self._verifier = verifier
        self.streams = CallLimit(max_streams, "Session streams", "retry later")
        self.unary_model_calls = CallLimit(
            max_unary_model_calls, "unary Prefill/Verify calls", "use Session streams or retry"
        )

    @property
    def verifier(self) -> LocalVerifier:
        if self._verifier is None:
            raise UnavailableError("the verifier is still loading its model")
        return self._verifier

    @verifier.setter
    def verifier(self, verifier: LocalVerifier) -> None:
        self._verifier = verifier

    def _prefill(
        self, request: verifier_pb2.PrefillRequest, unary: bool
    ) -> verifier_pb2.PrefillResponse:
        session_id = request.session_id or new_session_id()
        options = session_options_from_pb(request)
        result = self.verifier.start(session_id, request.prompt_token_ids, options, unary=unary)
        return verifier_pb2.PrefillResponse(
            session_id=session_id,
            token_id=result.token_ids[0],
            logprobs=logprobs_to_pb(result.logprobs),
        )

    def _verify(
        self, request: verifier_pb2.VerifyRequest, unary: bool
    ) -> verifier_pb2.VerifyResponse:
        self.verifier.check_draft_size(
            len(request.draft_token_ids), len(request.draft_distributions)
        )
        dists = [sparse_from_pb(d) for d in request.draft_distributions] or None
        result = self.verifier.verify(
            request.session_id,
            request.draft_token_ids,
            dists,
            request.draft_parents or None,
            unary=unary,
        )
        return verify_result_to_pb(result)

    @map_errors
    def Prefill(
        self, request: verifier_pb2.PrefillRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.PrefillResponse:
        with self.unary_model_calls.hold():
            return self._prefill(request, unary=True)

    @map_errors
    def Verify(
        self, request: verifier_pb2.VerifyRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.VerifyResponse:
        with self.unary_model_calls.hold():
            return self._verify(request, unary=True)

    @map_stream_errors
    def Session(
        self, requests: Iterator[verifier_pb2.SessionRequest], context: grpc.ServicerContext
    ) -> Iterator[verifier_pb2.SessionResponse]:
        """A prefill, then verifies, on one stream; the session is released when it ends.
        Its opening and end are logged (DEBUG) under the call's request id."""
        with self.streams.hold():
            yield from self._session(requests)

    def _session(
        self, requests: Iterator[verifier_pb2.SessionRequest]
    ) -> Iterator[verifier_pb2.SessionResponse]:
        session_id = ""
        verifies = 0
        try:
            for request in requests:
                if request.HasField("prefill"):
                    if session_id:
                        raise InvalidArgumentError("prefill", "only the first message may prefill")
                    prefill = request.prefill
                    # The stream owns its session: a fresh id, never one the client names
                    # (which could be another client's live session).
                    prefill.session_id = new_session_id()
                    response = self._prefill(prefill, unary=False)
                    session_id = response.session_id
                    log.debug(
                        "session %s: prefilled %d prompt tokens",
                        session_id,
                        len(prefill.prompt_token_ids),
                    )
                    yield verifier_pb2.SessionResponse(prefill=response)
                elif request.HasField("verify"):
                    if not session_id:
                        raise InvalidArgumentError("verify", "the first message must be a prefill")
                    verify = request.verify
                    verify.session_id = session_id
                    verifies += 1
                    yield verifier_pb2.SessionResponse(verify=self._verify(verify, unary=False))
                else:
                    raise InvalidArgumentError("step", "a message must be a prefill or a verify")
        finally:
            if session_id and self._verifier is not None:
                self._verifier.release(session_id)
                log.debug("session %s: released after %d verifies", session_id, verifies)

    @map_errors
    def Release(
        self, request: verifier_pb2.ReleaseRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.ReleaseResponse:
        released = self.verifier.release(request.session_id, unary=True)
        return verifier_pb2.ReleaseResponse(released=released)

    @map_errors
    def GetModelInfo(
        self, request: verifier_pb2.GetModelInfoRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.GetModelInfoResponse:
        return model_info_to_pb(self.verifier.info)

    @map_errors
    def GetStats(
        self, request: verifier_pb2.GetStatsRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.GetStatsResponse:
        return verifier_stats_to_pb(self.verifier.stats())


def start_server(
    config: VerifierConfig,
    host: str = "127.0.0.1",
    port: int = 50052,
    *,
    verifier: LocalVerifier | None = None,
    tls: ServerTls | None = None,
    metrics: Metrics | None = None,
) -> tuple[ServiceServer, LocalVerifier]:
    """Start the server (health NOT_SERVING), load the model, then report SERVING.

    Pass ``verifier`` to serve an already-built one (tests). ModelLoadError propagates after
    the server is stopped. metrics: count calls in it, and the verifier's stats once loaded
    (its /metrics endpoint is the caller's).
    """
    # One thread per Session stream (up to the session cap), and RESERVED_THREADS for the rest.
    server = ServiceServer(
        host,
        port,
        [SERVICE_NAME],
        max_workers=config.max_sessions + RESERVED_THREADS,
        tls=tls,
        metrics=metrics,
    )
    servicer = VerifierServicer(max_streams=config.max_sessions)
    verifier_pb2_grpc.add_VerifierServiceServicer_to_server(servicer, server.grpc_server)
    server.start()
    try:
        if verifier is None:
            # One torch thread runs no OpenMP pool, so forwards can run on the RPC threads
            # under a lock and skip a thread hand-off per round. (The configured count: the
            # model's load sets it, after this decision.)
            threads = config.torch_threads or torch.get_num_threads()
            verifier = LocalVerifier(config, model_thread=threads > 1)
    except BaseException:
        server.stop(grace=0)
        raise
    servicer.verifier = verifier
    if metrics is not None:
        metrics.registry.register(VerifierCollector(verifier.stats, verifier.cost_profile.cost))
    verifier.warm_up()
    server.set_serving()
    log.info("verifier serving %s on %s", verifier.info.model_name, server.address)
    return server, verifier
