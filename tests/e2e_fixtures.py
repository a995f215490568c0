"""Fixtures that run the whole system: the embedded decoder, and the three services on real
localhost ports (started in-process, torn down after the module)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from speculant.config import VerifierConfig
from speculant.v1 import gateway_pb2_grpc, verifier_pb2_grpc
from tests.conftest import STORIES_MODEL


@dataclass
class Services:
    draft_address: str
    verifier_address: str
    gateway_address: str
    draft_server: object
    gateway: gateway_pb2_grpc.GatewayServiceStub
    verifier: verifier_pb2_grpc.VerifierServiceStub


def verifier_config() -> VerifierConfig:
    return VerifierConfig(model_name=str(STORIES_MODEL), device="cpu")


@pytest.fixture(scope="session")
def embedded_decoder(tinystories_graph):
    from gateway import SpeculativeDecoder

    return SpeculativeDecoder(graph_path=tinystories_graph, verifier_config=verifier_config())


DRAFT_TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def services(tinystories_graph) -> Iterator[Services]:
    from draft_service.server import start_server as start_draft
    from gateway.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(tinystories_graph, port=0)
    verifier_server, local_verifier = start_verifier(verifier_config(), port=0)
    # A generous draft timeout: on a busy test machine a 0.25 s timeout (the default) can fire,
    # and a round with an empty draft changes which seeded samples are drawn (not their law),
    # which tests comparing seeded outputs of two runs must not see.
    gateway_server, _ = start_gateway(
        [draft.address], verifier_server.address, port=0, draft_timeout_s=DRAFT_TIMEOUT_S
    )
    channels = [grpc.insecure_channel(gateway_server.address)]
    channels.append(grpc.insecure_channel(verifier_server.address))
    try:
        yield Services(
            draft.address,
            verifier_server.address,
            gateway_server.address,
            draft,
            gateway_pb2_grpc.GatewayServiceStub(channels[0]),
            verifier_pb2_grpc.VerifierServiceStub(channels[1]),
        )
    finally:
        for channel in channels:
            channel.close()
        gateway_server.stop(0)
        verifier_server.stop(0)
        local_verifier.close()
        draft.stop(0)
