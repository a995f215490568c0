"""Next-round drafts: the draft service prepares drafts for the likeliest outcomes of a
verification while the verifier runs, and the gateway uses one when the outcome matches.

The property that matters: the output never changes. Each prepared draft must equal what the
drafter proposes for that outcome's context (same seed), so greedy generation stays identical to
Hugging Face greedy decoding and seeded sampling gives the same tokens with the feature on or off.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from gateway.backends.draft_client import GrpcDraftClient
from gateway.launch.baseline import PlainDecoder
from speculant.draft_params import DraftParams
from speculant.errors import RemoteError, UnavailableError
from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from tests.assets import STORIES_MODEL, dev_prompt_sets, load_dev_prompts
from tests.exactness_checks import assert_drafts_served
from tests.fixtures.e2e import DRAFT_TIMEOUT_S

PROMPTS = 12
MAX_TOKENS = 96
K = 8
PREPARED = 12
CONTEXT = [1, 403, 407, 261, 378, 432]  # BOS "Once upon a time," (stories260K tokenizer)


@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
def test_each_prepared_draft_is_what_the_drafter_proposes_for_its_outcome(
    tinystories_drafter, strategy
):
    params = DraftParams(k=K, strategy=strategy, tree_nodes=0)
    draft = tinystories_drafter.propose(CONTEXT, params, seed=3).token_ids
    assert len(draft) == K
    prepared = tinystories_drafter.next_round_drafts(
        CONTEXT, draft, params, seed=11, limit=PREPARED
    )
    assert len(prepared) == PREPARED
    outcomes = [(d.accepted_count, d.next_token) for d in prepared]
    assert len(set(outcomes)) == len(outcomes)
    for d in prepared:
        j = d.accepted_count
        assert 0 <= j <= len(draft)
        if j < len(draft):
            assert d.next_token != draft[j], "accepting d_{j+1} is not an outcome ending at j"
        expected = tinystories_drafter.propose(
            CONTEXT + draft[:j] + [d.next_token], params, seed=11
        )
        assert d.proposal.token_ids == expected.token_ids
        assert d.proposal.matched_orders == expected.matched_orders
        if strategy == "sampling":
            for got, want in zip(d.proposal.distributions, expected.distributions, strict=True):
                assert got.token_ids.tolist() == want.token_ids.tolist()
                assert got.probs.tolist() == want.probs.tolist()


def test_prepared_drafts_come_likeliest_first_and_respect_the_limit(tinystories_drafter):
    params = DraftParams(k=K, tree_nodes=0)
    draft = tinystories_drafter.propose(CONTEXT, params).token_ids
    assert tinystories_drafter.next_round_drafts(CONTEXT, draft, params, None, limit=0) == []
    few = tinystories_drafter.next_round_drafts(CONTEXT, draft, params, None, limit=3)
    many = tinystories_drafter.next_round_drafts(CONTEXT, draft, params, None, limit=PREPARED)
    # the 3 likeliest are the first 3 of the 12 likeliest
    assert [(d.accepted_count, d.next_token) for d in few] == [
        (d.accepted_count, d.next_token) for d in many[:3]
    ]


@pytest.fixture(scope="module")
def draft_stub(services) -> Iterator[draft_pb2_grpc.DraftServiceStub]:
    with grpc.insecure_channel(services.draft_address) as channel:
        yield draft_pb2_grpc.DraftServiceStub(channel)


def _request(**extra) -> draft_pb2.ProposeRequest:
    return draft_pb2.ProposeRequest(
        context_token_ids=CONTEXT,
        k=K,
        strategy=common_pb2.DRAFT_STRATEGY_GREEDY,
        tree_nodes=0,  # next-round drafts are prepared for chains
        **extra,
    )


def test_stream_sends_the_draft_then_the_prepared_drafts(draft_stub):
    responses = list(draft_stub.ProposeStream(iter([_request(next_round_drafts=4)]), timeout=10))
    assert len(responses) == 2
    first, second = responses
    assert len(first.draft_token_ids) == K and not first.next_round
    assert not second.draft_token_ids and len(second.next_round) == 4
    # greedy drafts travel without their point-mass q's
    assert all(not d.distributions and d.draft_token_ids for d in second.next_round)

    only = list(
        draft_stub.ProposeStream(
            iter([_request(next_round_drafts=4, next_round_only=True)]), timeout=10
        )
    )
    assert len(only) == 1 and list(only[0].next_round) == list(second.next_round)

    unary = draft_stub.Propose(_request(next_round_drafts=4), timeout=10)
    assert list(unary.draft_token_ids) == list(first.draft_token_ids)
    assert list(unary.next_round) == list(second.next_round)


def test_too_many_prepared_drafts_is_invalid_argument(draft_stub):
    with pytest.raises(grpc.RpcError) as caught:
        draft_stub.Propose(_request(next_round_drafts=65), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "next_round_drafts" in caught.value.details()


def test_a_dead_draft_service_gives_no_draft_and_no_prepared_drafts():
    client = GrpcDraftClient(["127.0.0.1:1"], timeout_s=2.0)
    call = client.start(CONTEXT, DraftParams(k=K, tree_nodes=0), None, PREPARED, None)
    with pytest.raises((RemoteError, UnavailableError)):
        call.proposal()
    assert call.next_round() == []


@pytest.fixture(scope="module")
def preparing_gateway(services) -> Iterator[gateway_pb2_grpc.GatewayServiceStub]:
    """A second gateway on the same draft and verifier services, preparing drafts."""
    from gateway.api.server import start_gateway

    server, _ = start_gateway(
        [services.draft_address],
        services.verifier_address,
        port=0,
        next_round_drafts=PREPARED,
        draft_timeout_s=DRAFT_TIMEOUT_S,
    )
    try:
        with grpc.insecure_channel(server.address) as channel:
            yield gateway_pb2_grpc.GatewayServiceStub(channel)
    finally:
        server.stop(0)


@pytest.fixture(scope="module", params=dev_prompt_sets(PROMPTS))
def prompts12(request: pytest.FixtureRequest) -> list[str]:
    return load_dev_prompts(*request.param)


def _generate(stub, prompt: str, strategy: int, temperature: float, seed: int):
    request = gateway_pb2.GenerateRequest(
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=temperature,
        seed=seed,
        draft=common_pb2.DraftOptions(k=K, strategy=strategy, tree_nodes=0),  # chains
    )
    return stub.Generate(request, timeout=60)


def test_greedy_output_is_plain_greedy_decoding(
    preparing_gateway,
    embedded_decoder,
    prompts12,
):
    plain = PlainDecoder.load(str(STORIES_MODEL), embedded_decoder.verifier.info.eos_token_ids)
    tokenizer = embedded_decoder.tokenizer
    used = rounds = 0
    stats = []
    for prompt in prompts12:
        expected = plain.generate(tokenizer(prompt).input_ids, MAX_TOKENS).token_ids
        response = _generate(preparing_gateway, prompt, common_pb2.DRAFT_STRATEGY_GREEDY, 0.0, 0)
        assert list(response.token_ids) == expected, prompt
        stats.append(response.stats)
        used += response.stats.prepared_drafts_used
        rounds += response.stats.rounds
    assert_drafts_served(stats)
    # the feature is exercised: a good share of rounds start from a prepared draft
    assert used > 0.2 * rounds, f"{used} prepared drafts used in {rounds} rounds"


@pytest.mark.parametrize(
    "strategy", [common_pb2.DRAFT_STRATEGY_GREEDY, common_pb2.DRAFT_STRATEGY_SAMPLING]
)
def test_seeded_sampling_gives_the_same_tokens_with_or_without_prepared_drafts(
    services,
    preparing_gateway,
    prompts12,
    strategy,
):
    used = 0
    for seed, prompt in enumerate(prompts12[:6]):
        plain = _generate(services.gateway, prompt, strategy, 0.8, seed)
        preparing = _generate(preparing_gateway, prompt, strategy, 0.8, seed)
        assert list(preparing.token_ids) == list(plain.token_ids), prompt
        assert plain.stats.prepared_drafts_used == 0
        used += preparing.stats.prepared_drafts_used
    assert used > 0
