"""Prometheus metrics, request ids and JSON logs of the three services.

The services run in-process on free localhost ports, each with its own metrics endpoint; the
figures are scraped over HTTP (tests.metric_samples). The services are shared by the module, so
checks compare scrapes taken before and after a call.

The metrics port flags, last: `speculant serve-draft --metrics-port` serves Prometheus metrics
(and logs JSON with --log-format json), a taken metrics port is a clean error, and `speculant up`
gives each service its own port from --metrics-port-base.
"""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
import pytest

from speculant.grpc_server import MetricsInterceptor
from speculant.health import wait_until_serving
from speculant.metrics import Metrics
from speculant.ports import free_port
from speculant.request_context import REQUEST_ID_HEADER, log_handler
from speculant.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.assets import ROOT
from tests.fixtures.e2e import verifier_config
from tests.metric_samples import (
    DRAFT,
    GATEWAY,
    VERIFIER,
    Samples,
    calls,
    delta,
    scrape,
    total,
    value,
    wait_for,
)


@dataclass
class Observed:
    gateway: gateway_pb2_grpc.GatewayServiceStub
    verifier_address: str
    gateway_port: int  # metrics ports
    draft_port: int
    verifier_port: int


@pytest.fixture(scope="module")
def observed(tinystories_graph) -> Iterator[Observed]:
    from draft_service.server import start_server as start_draft
    from gateway.api.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    metrics = [Metrics(), Metrics(), Metrics()]  # gateway, draft, verifier: one registry each
    ports = [m.serve(0) for m in metrics]
    draft = start_draft(tinystories_graph, port=0, metrics=metrics[1])
    verifier_server, local_verifier = start_verifier(verifier_config(), port=0, metrics=metrics[2])
    # A generous draft timeout: no round may lose its draft on a busy machine (counts below
    # compare the draft service's figures with the gateway's).
    gateway_server, _ = start_gateway(
        [draft.address], verifier_server.address, port=0, draft_timeout_s=30.0, metrics=metrics[0]
    )
    channel = grpc.insecure_channel(gateway_server.address)
    try:
        yield Observed(
            gateway_pb2_grpc.GatewayServiceStub(channel), verifier_server.address, *ports
        )
    finally:
        channel.close()
        gateway_server.stop(0)
        verifier_server.stop(0)
        local_verifier.close()
        draft.stop(0)
        for m in metrics:
            m.close()


def _generate(observed: Observed, **fields: object) -> gateway_pb2.GenerateResponse:
    request = gateway_pb2.GenerateRequest(
        **{"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.0, **fields}
    )
    return observed.gateway.Generate(request, timeout=120)


def _check_gateway_counts(
    gateway: Samples, gw0: Samples, stats: gateway_pb2.GenerationStats
) -> None:
    """The gateway: one call, OK, timed; its generation's figures."""
    assert calls(gateway, GATEWAY, "Generate", "OK") - calls(gw0, GATEWAY, "Generate", "OK") == 1
    assert (
        delta(
            gateway,
            gw0,
            "speculant_grpc_request_duration_seconds_count",
            service=GATEWAY,
            method="Generate",
        )
        == 1
    )
    assert stats.accepted_tokens > 0
    for name, expected in [
        ("speculant_gateway_generated_tokens_total", stats.generated_tokens),
        ("speculant_gateway_rounds_total", stats.rounds),
        ("speculant_gateway_draft_tokens_total", stats.draft_tokens),
        ("speculant_gateway_accepted_tokens_total", stats.accepted_tokens),
        ("speculant_gateway_accepted_by_position_total", stats.accepted_tokens),
        ("speculant_gateway_drafted_by_position_total", sum(stats.drafted_by_position)),
    ]:
        assert total(gateway, name) - total(gw0, name) == expected, name
    for position, accepted in enumerate(stats.accepted_by_position, start=1):
        assert (
            delta(
                gateway,
                gw0,
                "speculant_gateway_accepted_by_position_total",
                position=str(position),
            )
            == accepted
        )
    assert delta(gateway, gw0, "speculant_gateway_tokens_per_second_count") == 1
    assert value(gateway, "speculant_gateway_generations_in_flight") == 0


def _check_verifier_counts(
    verifier: Samples, ver0: Samples, stats: gateway_pb2.GenerationStats
) -> None:
    """The verifier: one message per round on the session stream, one session."""
    assert (
        delta(
            verifier,
            ver0,
            "speculant_grpc_stream_messages_total",
            service=VERIFIER,
            method="Session",
            direction="received",
        )
        == stats.rounds
    )
    assert delta(verifier, ver0, "speculant_verifier_sessions_created_total") == 1
    assert delta(verifier, ver0, "speculant_verifier_forward_passes_total") == stats.rounds


def _check_draft_counts(draft: Samples, draft0: Samples) -> None:
    """The draft service: one proposal per message on its stream; its graph has a reader."""
    proposals = delta(draft, draft0, "speculant_draft_proposals_total")
    assert proposals >= 1
    assert (
        delta(
            draft,
            draft0,
            "speculant_grpc_stream_messages_total",
            service=DRAFT,
            method="ProposeStream",
            direction="received",
        )
        == proposals
    )
    assert value(draft, "speculant_draft_graph_readers") >= 1


def test_generate_is_counted_on_every_service(observed):
    before = [
        scrape(p) for p in (observed.gateway_port, observed.draft_port, observed.verifier_port)
    ]
    # fixed sizes: every round drafts and verifies (cost-aware sizes follow the timings)
    stats = _generate(observed, draft=common_pb2.DraftOptions(draft_size="fixed")).stats
    gateway, draft, verifier = (
        scrape(p) for p in (observed.gateway_port, observed.draft_port, observed.verifier_port)
    )
    gw0, draft0, ver0 = before
    _check_gateway_counts(gateway, gw0, stats)
    _check_verifier_counts(verifier, ver0, stats)
    _check_draft_counts(draft, draft0)


def test_live_sessions_return_to_zero(observed):
    before = scrape(observed.verifier_port)
    _generate(observed)
    # The gateway ends its session stream, and the verifier releases the session, before
    # Generate returns; the stream's code is counted once gRPC has closed the call.
    assert value(scrape(observed.verifier_port), "speculant_verifier_live_sessions") == 0
    assert wait_for(
        lambda: (
            calls(scrape(observed.verifier_port), VERIFIER, "Session", "OK")
            == calls(before, VERIFIER, "Session", "OK") + 1
        )
    )
    after = scrape(observed.verifier_port)
    for code, expected in [("OK", 1), ("CANCELLED", 0)]:
        assert (
            calls(after, VERIFIER, "Session", code) - calls(before, VERIFIER, "Session", code)
            == expected
        )
    assert value(after, "speculant_verifier_sessions_released_total") == value(
        after, "speculant_verifier_sessions_created_total"
    )


def test_errors_are_counted_by_code(observed):
    before = scrape(observed.gateway_port)
    with pytest.raises(grpc.RpcError) as error:
        _generate(observed, max_tokens=(1 << 20) + 1)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = scrape(observed.gateway_port)
    for code, expected in [("INVALID_ARGUMENT", 1), ("OK", 0)]:
        assert (
            calls(after, GATEWAY, "Generate", code) - calls(before, GATEWAY, "Generate", code)
            == expected
        )


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    """Everything logged meanwhile (DEBUG and up), as JSON lines."""
    out = io.StringIO()
    handler = log_handler("json", out)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_request_id_reaches_the_backends(observed, json_logs):
    request_id = "test-request-42"
    _, call = observed.gateway.Generate.with_call(
        gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=32, temperature=0.0),
        metadata=((REQUEST_ID_HEADER, request_id),),
        timeout=120,
    )
    assert (REQUEST_ID_HEADER, request_id) in tuple(call.initial_metadata())
    records = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    assert records
    for record in records:
        assert {"time", "level", "logger", "message", "request_id"} <= set(record)
    loggers = {r["logger"] for r in records if r["request_id"] == request_id}
    assert {"gateway.engine", "draft_service.server", "verifier_service.server"} <= loggers


def test_a_request_id_is_made_when_none_is_given(observed):
    _, call = observed.gateway.Generate.with_call(
        gateway_pb2.GenerateRequest(prompt="Once", max_tokens=2, temperature=0.0), timeout=120
    )
    given = dict(call.initial_metadata()).get(REQUEST_ID_HEADER, "")
    assert len(given) == 32 and int(given, 16) >= 0  # a uuid4 in hex


def test_a_cancelled_stream_is_counted_cancelled(observed, json_logs):
    before = scrape(observed.verifier_port)
    requests: queue.SimpleQueue = queue.SimpleQueue()
    with grpc.insecure_channel(observed.verifier_address) as channel:
        responses = verifier_pb2_grpc.VerifierServiceStub(channel).Session(
            iter(requests.get, None), timeout=60
        )
        prefill = verifier_pb2.PrefillRequest(prompt_token_ids=[1, 403, 407], temperature=0.0)
        requests.put(verifier_pb2.SessionRequest(prefill=prefill))
        next(responses)
        # Let the server wait for the next message: there, a cancel makes its request stream
        # raise (the path that must not be logged as an error).
        time.sleep(1.0)
        responses.cancel()

    def settled() -> bool:
        now = scrape(observed.verifier_port)
        return (
            calls(now, VERIFIER, "Session", "CANCELLED")
            == calls(before, VERIFIER, "Session", "CANCELLED") + 1
            and value(now, "speculant_verifier_live_sessions") == 0
        )

    try:
        assert wait_for(settled)
    finally:
        # Only now end the request stream: sent right after the cancel, its end could reach
        # the server first, which then saw a normal end (OK), not CANCELLED.
        requests.put(None)
    records = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    assert not [r for r in records if r["level"] == "ERROR"]


def test_a_cancel_seen_as_the_request_stream_ending_is_counted_cancelled():
    """A client's cancel can reach a handler waiting on its request stream as the stream's
    normal end, the handler then returning normally: it is still counted CANCELLED. Before
    the fix, a few in a hundred of these cancels were counted OK."""
    metrics = Metrics()

    def echo(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            yield from requests
        except grpc.RpcError:  # the cancel seen as the request stream raising
            return

    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Chat": grpc.stream_stream_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[MetricsInterceptor(metrics)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    cancels = 100
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            chat = channel.stream_stream("/test.Echo/Chat")
            for _ in range(cancels):
                requests: queue.SimpleQueue = queue.SimpleQueue()
                responses = chat(iter(requests.get, None))
                requests.put(b"hello")
                next(responses)
                time.sleep(0.002)  # the handler waits on its request stream
                responses.cancel()
                requests.put(None)

        def codes() -> dict[str, float]:
            return {
                labels["code"]: sample.value
                for family in metrics.registry.collect()
                for sample in family.samples
                if sample.name == "speculant_grpc_requests_total"
                for labels in [sample.labels]
            }

        assert wait_for(lambda: sum(codes().values()) == cancels)
        assert codes() == {"CANCELLED": cancels}
    finally:
        server.stop(None)


# -- the metrics port flags --------------------------------------------------------------------


def _speculant(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_serve_draft_metrics_port_and_json_logs(tinystories_graph):
    grpc_port, metrics_port = free_port(), free_port()
    process = _speculant(
        "serve-draft",
        "--graph",
        str(tinystories_graph),
        "--port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        "--log-format",
        "json",
    )
    try:
        assert wait_until_serving(f"127.0.0.1:{grpc_port}", timeout_s=60)
        samples = scrape(metrics_port)
        assert calls(samples, "grpc.health.v1.Health", "Check", "OK") >= 1
        assert ("speculant_draft_graph_readers", ()) in samples
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    records = [json.loads(line) for line in stderr.splitlines()]
    messages = [r["message"] for r in records]
    assert any(m.startswith("metrics at http://127.0.0.1:") for m in messages), messages
    assert any(m.startswith("draft service serving") for m in messages), messages


def test_serve_draft_metrics_port_in_use(tinystories_graph):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _speculant(
            "serve-draft", "--graph", str(tinystories_graph), "--port", "0",
            "--metrics-port", str(port),
        )  # fmt: skip
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "speculant serve-draft: error: cannot serve metrics on 127.0.0.1:" in stderr
    assert "Traceback" not in stderr


def test_up_gives_each_service_its_metrics_port():
    from gateway.launch.up_plan import plan_up, service_parser
    from launcher.cli import build_parser

    def observability(*extra: str) -> dict[str, tuple[str, int | None]]:
        """Each child's --log-format and --metrics-port, as its own service parses them."""
        args = build_parser().parse_args(["up", "--graph", "g", "--model", "m", *extra])
        children = {c.name: service_parser().parse_args(c.argv) for c in plan_up(args).children}
        return {name: (a.log_format, a.metrics_port) for name, a in children.items()}

    assert observability("--metrics-port-base", "9100", "--log-format", "json") == {
        "gateway": ("json", 9100),
        "draft": ("json", 9101),
        "verifier": ("json", 9102),
    }
    assert observability() == {name: ("text", None) for name in ("gateway", "draft", "verifier")}
