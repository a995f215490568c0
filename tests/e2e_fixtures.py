"""Fixtures that run the whole system: the embedded decoder, and the three services on real
localhost ports (started in-process, torn down after the module)."""

from __future__ import annotations

import contextlib
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
    """The embedded decoder with drafts from the graph alone (learn=False): tests that compare
    drafting configurations or repeat seeded sampled-draft requests need drafts that do not
    change as a decoder learns. learning_decoder is the default, learning one."""
    from gateway import SpeculativeDecoder

    return SpeculativeDecoder(
        graph_path=tinystories_graph, verifier_config=verifier_config(), learn=False
    )


@pytest.fixture(scope="session")
def learning_decoder(tinystories_graph):
    """The embedded decoder as users get it: it learns from every generation it finishes."""
    from gateway import SpeculativeDecoder

    return SpeculativeDecoder(graph_path=tinystories_graph, verifier_config=verifier_config())


DRAFT_TIMEOUT_S = 10.0


@contextlib.contextmanager
def running_services(graph, *, learn: bool) -> Iterator[Services]:
    """The three services on free localhost ports, in this process. learn: the draft service
    learns from the generations the gateway reports (in memory, no learn log)."""
    from draft_service.learning import LearningConfig
    from draft_service.server import start_server as start_draft
    from gateway.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(graph, port=0, learning=LearningConfig(log_path=None) if learn else None)
    verifier_server, local_verifier = start_verifier(verifier_config(), port=0)
    # A generous draft timeout: on a busy test machine a 0.25 s timeout (the default) can fire,
    # and a round with an empty draft changes which seeded samples are drawn (not their law),
    # which tests comparing seeded outputs of two runs must not see.
    gateway_server, _ = start_gateway(
        [draft.address],
        verifier_server.address,
        port=0,
        draft_timeout_s=DRAFT_TIMEOUT_S,
        learn=learn,
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


@pytest.fixture(scope="module")
def services(tinystories_graph) -> Iterator[Services]:
    """The services with drafts from the graph alone (see embedded_decoder for why)."""
    with running_services(tinystories_graph, learn=False) as running:
        yield running


@pytest.fixture(scope="module")
def learning_services(tinystories_graph) -> Iterator[Services]:
    """The services as users get them: the draft service learns from every generation."""
    with running_services(tinystories_graph, learn=True) as running:
        yield running
