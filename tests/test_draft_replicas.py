"""Several draft replicas behind one gateway: round robin shares the load evenly, and a replica
killed with SIGKILL mid-run fails no request and changes no output (drafts are an
optimisation); the dead replica is held off instead of being asked every round."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from gateway.backends import REPLICA_HOLD_OFF_S, GrpcDraftClient, expand_addresses
from speculant.config import DraftParams
from speculant.errors import InvalidArgumentError
from speculant.health import wait_until_serving
from speculant.ports import free_ports
from speculant.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.assets import load_dev_prompts

REPLICAS = 3
CONTEXT = [1, 403, 407, 261, 378, 432]


class CountingDrafter:
    """Wraps a Drafter and counts the proposals it makes."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter
        self.calls = 0

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def propose(self, *args, **kwargs):
        self.calls += 1
        return self.drafter.propose(*args, **kwargs)


def test_round_robin_shares_calls_evenly(tinystories_graph):
    from draft_service.server import start_server

    servers = [start_server(tinystories_graph, port=0) for _ in range(REPLICAS)]
    counters = []
    for server in servers:
        counters.append(CountingDrafter(server.servicer.drafter))
        server.servicer.drafter = counters[-1]
    try:
        client = GrpcDraftClient([s.address for s in servers], timeout_s=5.0)
        for _ in range(999):
            client.propose(CONTEXT, DraftParams(k=4))
        shares = [c.calls for c in counters]
        assert sum(shares) == 999
        assert all(abs(share - 333) <= 33 for share in shares), shares  # within +-10% of even
    finally:
        for server in servers:
            server.stop(0)


@pytest.fixture
def replica_processes(tinystories_graph) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    replicas = []
    for port in free_ports(REPLICAS):
        command = [sys.executable, "-m", "launcher.cli", "serve-draft", "--graph"]
        command += [str(tinystories_graph), "--port", str(port)]
        process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        replicas.append((f"127.0.0.1:{port}", process))
    try:
        for address, _ in replicas:
            assert wait_until_serving(address, timeout_s=60)
        yield replicas
    finally:
        for _, process in replicas:
            if process.poll() is None:
                process.kill()
            process.wait()


def test_a_replica_killed_mid_run_fails_nothing_and_changes_nothing(
    services,
    replica_processes,
):
    from gateway.api.server import start_gateway

    addresses = [address for address, _ in replica_processes]
    server, engine = start_gateway(addresses, services.verifier_address, port=0)
    prompts = load_dev_prompts(6)
    client = engine.drafter
    failed_calls = []
    hold_off = client.hold_off

    def counting_hold_off(replica) -> None:
        failed_calls.append(replica.address)
        hold_off(replica)

    client.hold_off = counting_hold_off

    def generate_all(stub, during=None) -> list[tuple[list[int], int]]:
        outputs = []
        for prompt in prompts:
            request = gateway_pb2.GenerateRequest(
                prompt=prompt,
                max_tokens=96,
                temperature=0,
                draft=common_pb2.DraftOptions(k=8),
            )
            if during is not None:  # kill while this generation is in flight
                threading.Timer(0.02, during).start()
                during = None
            response = stub.Generate(request, timeout=60)  # raises if the request fails
            outputs.append((list(response.token_ids), response.stats.draft_failures))
        return outputs

    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            healthy = generate_all(stub)
            assert all(failures == 0 for _, failures in healthy)
            victim = replica_processes[0][1]
            started = time.monotonic()
            faulty = generate_all(stub, during=lambda: os.kill(victim.pid, signal.SIGKILL))
            assert victim.wait(timeout=10) == -signal.SIGKILL
            assert [tokens for tokens, _ in faulty] == [tokens for tokens, _ in healthy]
            # every failed call went on to another replica: no round lost its draft
            assert all(failures == 0 for _, failures in faulty)
            # the dead replica is held off: one failed call per hold-off period at most, not
            # one in three rounds (6 generations of about 35 rounds each)
            elapsed = time.monotonic() - started
            assert failed_calls and set(failed_calls) == {addresses[0]}
            assert len(failed_calls) <= elapsed / REPLICA_HOLD_OFF_S + 2, len(failed_calls)
    finally:
        server.stop(0)


def test_a_dns_name_becomes_one_replica_per_address(services):
    port = services.draft_address.rsplit(":", 1)[1]
    expanded = expand_addresses([f"dns:localhost:{port}", "10.0.0.9:1"])
    assert f"127.0.0.1:{port}" in expanded and expanded[-1] == "10.0.0.9:1"
    assert len(expanded) == len(set(expanded))
    with pytest.raises(InvalidArgumentError, match="dns:NAME:PORT"):
        expand_addresses(["dns:no-port"])
    client = GrpcDraftClient(expand_addresses([f"dns:localhost:{port}"]), timeout_s=5.0)
    for _ in range(4):  # whatever else localhost resolves to (::1) is held off, not fatal
        assert client.propose(CONTEXT, DraftParams(k=4)).token_ids


def test_the_replica_set_follows_the_resolver(tinystories_graph):
    """What a scaler does to a headless service: a replica joins, then another leaves; the client
    (refreshing in the background, as the gateway does for dns: entries) follows both."""
    from draft_service.server import start_server

    servers = [start_server(tinystories_graph, port=0) for _ in range(2)]
    counters = []
    for server in servers:
        counters.append(CountingDrafter(server.servicer.drafter))
        server.servicer.drafter = counters[-1]
    a, b = (server.address for server in servers)
    current = [a]
    client = GrpcDraftClient(
        ["dns:draft.example:50051"], timeout_s=5.0, refresh_s=0.05, resolve=lambda _: current
    )

    def calls_after(n: int) -> list[int]:
        before = [c.calls for c in counters]
        for _ in range(n):
            assert client.propose(CONTEXT, DraftParams(k=4)).token_ids
        return [c.calls - was for c, was in zip(counters, before, strict=True)]

    def wait_for(addresses: list[str]) -> None:
        deadline = time.monotonic() + 5
        while client.addresses != addresses:
            assert time.monotonic() < deadline, client.addresses
            time.sleep(0.01)

    try:
        assert calls_after(20) == [20, 0]
        current = [a, b]  # a replica joins
        wait_for([a, b])
        assert calls_after(20) == [10, 10]
        current = [b]  # the first one leaves
        wait_for([b])
        assert calls_after(20) == [0, 20]
        current = []  # resolving to nothing keeps the last set
        time.sleep(0.2)
        assert client.addresses == [b] and calls_after(4) == [0, 4]
    finally:
        client.close()
        for server in servers:
            server.stop(0)
