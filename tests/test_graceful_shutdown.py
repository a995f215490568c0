"""Stopping a service: graceful shutdown of the gateway (on SIGTERM it reports NOT_SERVING,
refuses new calls, lets the generations in flight finish, then exits 0), and SIGINT/SIGTERM of a
serving process (speculant.termination), in child processes: before it serves, a signal stops
the start at once (unwinding it); once it serves, a signal only asks for the graceful stop,
however soon after SERVING it comes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from speculant.grpc_server import ServiceServer
from speculant.health import health_status, wait_until_serving
from speculant.ports import free_ports
from speculant.v1 import gateway_pb2, gateway_pb2_grpc
from tests.assets import ROOT


def test_sigterm_finishes_in_flight_generations_then_exits(services):
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    command = [sys.executable, "-m", "launcher.cli", "serve-gateway", "--port", str(port)]
    command += ["--draft", services.draft_address, "--verifier", services.verifier_address]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        assert wait_until_serving(address, timeout_s=60)
        channel = grpc.insecure_channel(address)
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        long_request = gateway_pb2.GenerateRequest(
            prompt="Once upon a time", max_tokens=480, temperature=0
        )
        chunks: list = []
        first_chunk = threading.Event()
        failure: list[BaseException] = []

        def stream() -> None:
            try:
                for chunk in stub.GenerateStream(long_request, timeout=60):
                    chunks.append(chunk)
                    first_chunk.set()
            except BaseException as exc:  # reported below
                failure.append(exc)
                first_chunk.set()

        in_flight = threading.Thread(target=stream)
        in_flight.start()
        assert first_chunk.wait(30)
        process.send_signal(signal.SIGTERM)
        chunks_at_sigterm = len(chunks)
        # NOT_SERVING is set first; then the server takes no new calls, health checks included.
        # Decided by events, not by a time: a probe that times out on a busy host (UNREACHABLE)
        # says nothing, so poll until the server answers NOT_SERVING or its process has exited.
        deadline = time.monotonic() + 60.0
        status = health_status(address, timeout_s=10)
        while status != "NOT_SERVING" and process.poll() is None:
            assert time.monotonic() < deadline, f"still {status} 60 s after SIGTERM"
            time.sleep(0.02)
            status = health_status(address, timeout_s=10)
        with grpc.insecure_channel(address) as fresh:
            late = gateway_pb2_grpc.GatewayServiceStub(fresh)
            try:
                late.Generate(long_request, timeout=30)
                outcome = "served"
            except grpc.RpcError as exc:
                outcome = exc.code().name
        assert outcome == "UNAVAILABLE", f"a call after SIGTERM must be refused, got {outcome}"
        in_flight.join(timeout=60)
        assert not failure, failure
        assert len(chunks) > chunks_at_sigterm  # it went on after SIGTERM ...
        final = chunks[-1]  # ... to the end
        assert final.HasField("stats")
        assert final.finish_reason == gateway_pb2.FINISH_REASON_MAX_TOKENS
        assert sum(len(c.token_ids) for c in chunks) == 480
        assert process.wait(timeout=30) == 0
        channel.close()
    finally:
        if process.poll() is None:
            process.kill()


def test_once_stopping_new_calls_are_refused_before_grpc_stops_and_probes_still_answer():
    """stop() marks the server stopping, then reports NOT_SERVING, then asks grpc to stop: a
    client that reads NOT_SERVING and calls at once must be refused already, not served
    (before the fix it was served, in the moment before grpc's stop)."""
    server = ServiceServer("127.0.0.1", 0, ["test.Echo"])
    echo = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    server.grpc_server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Echo", {"Say": echo}),)
    )
    server.start()
    server.set_serving()
    try:
        with grpc.insecure_channel(server.address) as channel:
            say = channel.unary_unary("/test.Echo/Say")
            assert say(b"hello", timeout=10) == b"hello"
            server.stopping.set()  # what stop() does first, here without grpc's stop after it
            with pytest.raises(grpc.RpcError) as refused:
                say(b"hello", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in refused.value.details()
            server.set_serving(False)
            assert health_status(server.address) == "NOT_SERVING"  # probes still answered
    finally:
        server.stop(0)


# -- a signal before and right after SERVING (speculant.termination) ---------------------------


def run_child(body: str) -> subprocess.CompletedProcess[str]:
    script = "import os, signal, time\nfrom speculant import termination\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_sigterm_while_starting_exits_143_and_unwinds_the_start():
    child = run_child(
        """
        termination.catch()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # a model loading
        finally:
            print("unwound")
        """
    )
    assert child.returncode == 143, child.stderr
    assert child.stdout.strip() == "unwound"


def test_sigint_while_starting_raises_keyboard_interrupt():
    child = run_child(
        """
        termination.catch()
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "interrupted"


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_right_after_serving_asks_for_the_graceful_stop(signum):
    # The moment that lost signals before: SERVING reported, the wait not yet begun.
    child = run_child(
        f"""
        termination.catch()
        termination.started_serving()
        os.kill(os.getpid(), signal.{signum})
        time.sleep(0.2)  # logging, the last steps of a start
        termination.wait_for_signal()
        print("stopping gracefully")
        """
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "stopping gracefully"


def test_an_interrupt_raised_where_python_drops_it_still_stops_a_batch_loop():
    # A KeyboardInterrupt raised inside a finalizer is only printed ("Exception ignored"):
    # with Python's default handler the loop below would run to its end.
    child = run_child(
        """
        termination.catch_interrupt()

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)  # the handler runs here, inside the finalizer

        Finalized()
        try:
            for _ in range(300):
                termination.check_interrupt()
                time.sleep(0.1)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        """
    )
    assert child.stdout.strip() == "interrupted", child.stderr
