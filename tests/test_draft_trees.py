"""Draft trees: the drafter proposes several branches, the verifier checks them all in one
forward pass (a tree attention mask) and keeps the longest path it agrees with.

Exactness is the point: greedy output identical to Hugging Face greedy decoding (embedded and
over the services), sampled output following the model (chi-square, with a negative control),
and the verifier's KV cache holding exactly the accepted path afterwards.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import verifier_service.batching as batching_module
from draft_service.tree import SAMPLED_TREE_WIDTH, TREE_WIDTH
from speculant.config import DraftConfig, DraftParams
from speculant.errors import InvalidArgumentError
from speculant.types import DraftProposal
from speculant.v1 import common_pb2, gateway_pb2
from tests.exactness_checks import (
    assert_drafts_served,
    assert_parallel,
    generate_embedded,
    generate_over_gateway,
    plain_greedy_outputs,
    totals,
)
from tests.fixtures.models import first_token
from tests.sampling_checks import (
    PROMPT,
    chi_square_p_value,
    exact_joint,
    sample_pairs,
)
from verifier_service.sampling import RejectionOutput, tree_sample

CONTEXT = [1, 403, 407, 261, 378, 432]  # BOS "Once upon a time," (stories260K tokenizer)
K = 8
TREE = 24


def _child(proposal: DraftProposal, parent: int, token: int) -> int | None:
    for i, (t, p) in enumerate(zip(proposal.token_ids, proposal.parents, strict=True)):
        if p == parent and t == token:
            return i
    return None


def test_a_tree_holds_the_greedy_chain_and_its_likeliest_alternatives(tinystories_drafter):
    chain = tinystories_drafter.propose(CONTEXT, DraftParams(k=K, tree_nodes=0))
    tree = tinystories_drafter.propose(CONTEXT, DraftParams(k=K, tree_nodes=TREE))
    assert len(tree.token_ids) == TREE == len(tree.parents) == len(tree.distributions)
    assert all(-1 <= p < i for i, p in enumerate(tree.parents))
    assert max(tree.depths()) == K - 1
    siblings: dict[int, list[int]] = {}
    for token, parent in zip(tree.token_ids, tree.parents, strict=True):
        siblings.setdefault(parent, []).append(token)
    assert all(len(set(s)) == len(s) <= TREE_WIDTH for s in siblings.values())
    node = -1  # the greedy chain is a path of the tree
    for token in chain.token_ids:
        node = _child(tree, node, token)
        assert node is not None
    # point masses, as the verifier assumes for a tree
    assert all(d.probs.tolist() == [1.0] for d in tree.distributions)


def test_a_tree_with_the_overlay_holds_the_overlay_chain(tinystories_drafter):
    """With the overlay, a tree's nodes come from the combined counts: its greedy first branch
    is the overlay chain, and tokens only the context knows are marked as the overlay's."""
    context = [*CONTEXT, 500, 501, 502, 503, 504, 505, *CONTEXT, 500]  # an unusual phrase
    params = DraftParams(k=K, tree_nodes=TREE, overlay_weight=4)
    tree = tinystories_drafter.propose(context, params)
    chain = tinystories_drafter.propose(context, DraftParams(k=K, overlay_weight=4, tree_nodes=0))
    assert chain.token_ids[:5] == [501, 502, 503, 504, 505]  # what only the context has
    assert tree.parents and len(tree.token_ids) == TREE
    node = -1
    for token in chain.token_ids:
        node = _child(tree, node, token)
        assert node is not None
    assert {tree.sources[_child(tree, -1, 501)]} <= {"overlay", "both"}
    without = tinystories_drafter.propose(
        context, DraftParams(k=K, tree_nodes=TREE, overlay_weight=0.0)
    )
    assert _child(without, -1, 501) is None  # the graph alone never drafts it
    with pytest.raises(InvalidArgumentError, match="tree_nodes"):
        DraftParams(tree_nodes=65).validate()


def test_a_sampled_tree_draws_siblings_without_replacement(tinystories_drafter):
    params = DraftParams(k=K, strategy="sampling", tree_nodes=TREE)
    tree = tinystories_drafter.propose(CONTEXT, params, seed=3)
    again = tinystories_drafter.propose(CONTEXT, params, seed=3)
    assert tree.token_ids == again.token_ids  # seeded
    assert 0 < len(tree.token_ids) <= TREE == params.tree_nodes
    assert all(-1 <= p < i for i, p in enumerate(tree.parents))
    assert max(tree.depths()) <= K - 1
    siblings: dict[int, list[int]] = {}
    for index, parent in enumerate(tree.parents):
        siblings.setdefault(parent, []).append(index)
    for group in siblings.values():
        assert len(group) <= SAMPLED_TREE_WIDTH
        drawn: list[int] = []
        for index in group:  # q_i: the node's q without the earlier siblings, renormalised
            q = tree.distributions[index]
            token = tree.token_ids[index]
            assert abs(float(q.probs.sum()) - 1.0) < 1e-9
            assert float(q.probs[q.token_ids == token].sum()) > 0
            assert not set(drawn) & set(q.token_ids.tolist())
            drawn.append(token)
        first = tree.distributions[group[0]]
        for index in group[1:]:  # the same q up to renormalisation
            later = tree.distributions[index]
            ratio = [
                later.probs[later.token_ids == t][0] / first.probs[first.token_ids == t][0]
                for t in later.token_ids
            ]
            assert np.allclose(ratio, ratio[0])


def test_truncating_a_tree_keeps_its_top_levels(tinystories_drafter):
    tree = tinystories_drafter.propose(CONTEXT, DraftParams(k=K, tree_nodes=TREE))
    top = tree.truncated(2)
    assert max(top.depths()) == 1
    kept = [i for i, d in enumerate(tree.depths()) if d < 2]
    assert top.token_ids == [tree.token_ids[i] for i in kept]
    for i, parent in enumerate(top.parents):  # same parent tokens as in the full tree
        original = tree.parents[kept[i]]
        assert parent == (-1 if original == -1 else kept.index(original))


def _logits(rows: list[int], vocab: int = 8) -> torch.Tensor:
    """Logits [len(rows), vocab] that put all the mass on rows[r] at row r."""
    logits = torch.full((len(rows), vocab), float("-inf"))
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 0.0
    return logits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_walk_follows_the_matching_child(temperature):
    # pending -> {3 (node 0), 5 (node 1)}; node 1 -> {6 (node 2)}; node 2 -> {7 (node 3)}
    drafts, parents = [3, 5, 6, 7], [-1, -1, 1, 2]
    # the model wants 5, then 6, then 2 (not 7): path 1, 2 accepted, 2 is the correction
    out = tree_sample(_logits([5, 0, 6, 2, 0]), drafts, parents, temperature)
    assert out == RejectionOutput(2, [5, 6, 2], (1, 2))
    # the model wants a token no child has: nothing accepted
    assert tree_sample(_logits([4, 0, 0, 0, 0]), drafts, parents, temperature).token_ids == [4]
    # the whole branch accepted, then the bonus token from the leaf's row
    out = tree_sample(_logits([5, 0, 6, 7, 1]), drafts, parents, temperature)
    assert out == RejectionOutput(3, [5, 6, 7, 1], (1, 2, 3))


def test_tree_walk_is_seeded():
    logits = torch.randn(4, 16)
    drafts, parents = [1, 2, 3], [-1, -1, 0]
    draws = [
        tree_sample(logits, drafts, parents, 1.0, torch.Generator().manual_seed(s)).token_ids
        for s in (7, 7, 8)
    ]
    assert draws[0] == draws[1]


def test_the_verifier_keeps_exactly_the_accepted_path_in_its_cache(embedded_decoder):
    """After a tree verification the session continues as if the accepted tokens had been fed
    one by one: its next logits equal a fresh forward over the whole sequence."""
    verifier = embedded_decoder.verifier
    model = verifier.model
    prompt = embedded_decoder.tokenizer("Once upon a time, there was").input_ids
    first = first_token(verifier, "tree-cache", prompt, temperature=0.0)
    with torch.inference_mode():
        row = model.model(torch.tensor([[*prompt, first]])).logits[0, -1]
    wanted = int(torch.argmax(row))
    # a tree whose second branch (not the first nodes) holds the model's choice
    drafts, parents = [(wanted + 1) % 512, (wanted + 2) % 512, wanted], [-1, -1, -1]
    result = verifier.verify("tree-cache", drafts, None, parents)
    assert result.accepted_count == 1 and result.accepted_nodes == [2]
    sequence = [*prompt, first, *result.token_ids]
    with verifier.sessions.use("tree-cache") as session, torch.inference_mode():
        assert session.length == len(sequence) - 1 == session.cache.get_seq_length()
        expected = model.model(torch.tensor([sequence])).logits[0, -1]
        got = model.forward(session.cache, torch.tensor([sequence[-1]]), session.length, 1)[0]
    assert torch.allclose(got, expected, atol=1e-4)
    verifier.release("tree-cache")


def test_bad_trees_are_invalid_argument(embedded_decoder):
    verifier = embedded_decoder.verifier
    first_token(verifier, "bad-tree", [1, 403, 407], temperature=0.0)
    with pytest.raises(InvalidArgumentError, match=r"draft_parents\[1\]"):
        verifier.verify("bad-tree", [5, 6], None, [-1, 1])
    with pytest.raises(InvalidArgumentError, match="draft_parents"):
        verifier.verify("bad-tree", [5, 6], None, [-1])
    verifier.release("bad-tree")


@pytest.mark.parametrize("overlay_weight", [0.0, 4.0])
def test_greedy_tree_output_is_plain_greedy_decoding_embedded(
    embedded_decoder,
    prompts16,
    references16,
    overlay_weight,
):
    # fixed sizes: every drafted node is verified (tree against chain, not the cost model)
    draft = DraftConfig(k=K, tree_nodes=TREE, overlay_weight=overlay_weight, draft_size="fixed")
    mismatches, stats = generate_embedded(embedded_decoder, prompts16, references16, draft)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    rounds, tokens = totals(stats)
    assert_parallel(rounds, tokens, "greedy")
    # a chain of k (tree_nodes=0: DraftConfig's default draft is itself a tree, of 12)
    chain_draft = DraftConfig(k=K, tree_nodes=0, overlay_weight=overlay_weight, draft_size="fixed")
    chain = generate_embedded(embedded_decoder, prompts16, references16, chain_draft)[1]
    assert rounds < 0.9 * totals(chain)[0], "trees should need fewer verifier forwards"


def test_sampled_tree_output_at_temperature_0_is_plain_greedy_decoding(
    embedded_decoder,
    prompts16,
    references16,
):
    draft = DraftConfig(k=K, tree_nodes=TREE, strategy="sampling")
    subset = prompts16[:8]
    mismatches, stats = generate_embedded(embedded_decoder, subset, references16[:8], draft)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(*totals(stats), "sampling")


@pytest.mark.parametrize(
    "strategy", [common_pb2.DRAFT_STRATEGY_GREEDY, common_pb2.DRAFT_STRATEGY_SAMPLING]
)
def test_tree_output_is_plain_greedy_decoding_over_services(
    services,
    prompts16,
    references16,
    strategy,
):
    draft = common_pb2.DraftOptions(k=K, strategy=strategy, tree_nodes=TREE, draft_size="fixed")
    mismatches, stats = generate_over_gateway(
        services.gateway, prompts16[:8], references16[:8], draft
    )
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_drafts_served(stats)
    greedy = strategy == common_pb2.DRAFT_STRATEGY_GREEDY
    assert_parallel(*totals(stats), "greedy" if greedy else "sampling")


def test_tree_size_is_validated_by_the_gateway(services):
    request = gateway_pb2.GenerateRequest(
        prompt="Once", max_tokens=4, draft=common_pb2.DraftOptions(tree_nodes=65)
    )
    with pytest.raises(grpc.RpcError) as caught:
        services.gateway.Generate(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tree_nodes" in caught.value.details()


def test_sampling_through_a_tree_follows_the_model(embedded_decoder):
    prompt_ids = embedded_decoder.tokenizer(PROMPT).input_ids
    joint = exact_joint(embedded_decoder, prompt_ids, 1.0)
    counts = sample_pairs(embedded_decoder, prompt_ids, 1.0, "greedy", tree_nodes=8)
    p_value = chi_square_p_value(joint, counts)
    assert p_value > 1e-3, f"sampled pairs do not follow the model (p = {p_value:.2e})"


# with the overlay, a prompt that repeats itself (the context has successors for its end) and a
# large weight, so that q differs much from the graph's and from the model's
OVERLAY_PROMPT = "Tom had a red ball. Tom had a"


@pytest.mark.parametrize(
    ("prompt", "overlay_weight"),
    [pytest.param(PROMPT, 0.0, marks=pytest.mark.slow), (OVERLAY_PROMPT, 1000.0)],
)
def test_sampling_through_a_sampled_tree_follows_the_model(
    embedded_decoder,
    prompt,
    overlay_weight,
):
    prompt_ids = embedded_decoder.tokenizer(prompt).input_ids
    if overlay_weight:  # the overlay does take part: the greedy draft is the context's successor
        params = DraftParams(k=4, tree_nodes=8, overlay_weight=overlay_weight)
        tree = embedded_decoder.coordinator.drafter.propose(prompt_ids, params)
        assert tree.sources[0] in ("overlay", "both")
    joint = exact_joint(embedded_decoder, prompt_ids, 1.0)
    counts = sample_pairs(
        embedded_decoder, prompt_ids, 1.0, "sampling", tree_nodes=8, overlay_weight=overlay_weight
    )
    p_value = chi_square_p_value(joint, counts)
    assert p_value > 1e-3, f"sampled pairs do not follow the model (p = {p_value:.2e})"


def _toy_rule_draws(rule, p: torch.Tensor, q: np.ndarray, runs: int) -> np.ndarray:
    """How often each token is emitted first by `rule` (a tree_sample) on a one-level tree of
    two children drawn from q without replacement; the target is p (a [V] distribution)."""
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    logits = torch.log(p).repeat(3, 1)  # [3, V]: the same p at every node
    counts = np.zeros(p.shape[0])
    for _ in range(runs):
        first = int(rng.choice(q.size, p=q))
        rest = q.copy()
        rest[first] = 0.0
        rest /= rest.sum()
        second = int(rng.choice(q.size, p=rest))
        dense = torch.tensor(np.stack([q, rest]), dtype=torch.float32)  # [2, V]: q_1, q_2
        out = rule(logits, [first, second], [-1, -1], 1.0, generator, dense)
        counts[out.token_ids[0]] += 1
    return counts


P_TOY = torch.tensor([0.05, 0.10, 0.15, 0.30, 0.40])
Q_TOY = np.array([0.40, 0.30, 0.15, 0.10, 0.05])


def test_the_recursive_rule_emits_draws_from_p():
    runs = 20_000
    counts = _toy_rule_draws(tree_sample, P_TOY, Q_TOY, runs)
    assert chisquare(counts, P_TOY.numpy() * runs).pvalue > 1e-3


def test_the_recursive_rule_without_residual_updates_is_caught():
    """Negative control: judging the second sibling against p itself (no residual update)."""

    def no_update(logits, drafts, parents, temperature, generator, draft_probs):
        p = torch.softmax(logits[0], -1)
        for child, token in enumerate(drafts):
            accept = min(1.0, float(p[token] / draft_probs[child, token]))
            if float(torch.rand(1, generator=generator)) < accept:
                return RejectionOutput(1, [token, 0], (child,))
        return RejectionOutput(0, [int(torch.multinomial(p, 1, generator=generator))])

    runs = 20_000
    counts = _toy_rule_draws(no_update, P_TOY, Q_TOY, runs)
    assert chisquare(counts, P_TOY.numpy() * runs).pvalue < 1e-6


def test_a_wrong_tree_rule_is_caught(embedded_decoder, monkeypatch):
    """Negative control: when the sampled token is any child, take the first child instead."""

    def wrong_tree_sample(logits, drafts, parents, temperature, generator=None, q=None):
        out = tree_sample(logits, drafts, parents, temperature, generator, q)
        if out.accepted_count:
            first = drafts[0]
            return RejectionOutput(1, [first, *out.token_ids[1:]], (0,))
        return out

    monkeypatch.setattr(batching_module, "tree_sample", wrong_tree_sample)
    prompt_ids = embedded_decoder.tokenizer(PROMPT).input_ids
    joint = exact_joint(embedded_decoder, prompt_ids, 1.0)
    # fixed sizes: every run verifies its tree, so the wrong rule is exercised in every run
    counts = sample_pairs(
        embedded_decoder, prompt_ids, 1.0, "greedy", tree_nodes=8, draft_size="fixed"
    )
    p_value = chi_square_p_value(joint, counts)
    assert p_value < 1e-6, f"the test failed to catch a wrong rule (p = {p_value:.2e})"


def test_depths_of_a_chain_and_a_tree():
    assert DraftProposal([4, 5, 6]).depths() == [0, 1, 2]
    assert DraftProposal([4, 5, 6, 7], parents=[-1, -1, 0, 2]).depths() == [0, 0, 1, 2]
    assert np.array_equal(DraftProposal().depths(), [])


def test_a_model_without_tree_support_checks_the_first_branch(embedded_decoder, monkeypatch):
    verifier = embedded_decoder.verifier
    assert verifier.model.supports_trees  # stories260K with sdpa: trees match chain forwards
    prompt_text = "Once upon a time, there was"
    prompt = embedded_decoder.tokenizer(prompt_text).input_ids
    e = plain_greedy_outputs(embedded_decoder, [prompt_text], 4)[0]  # greedy e[0..3]
    monkeypatch.setattr(verifier.model, "_supports_trees", False)
    wrong = (e[1] + 1) % verifier.info.vocab_size
    # the model's choice sits in the second branch only: not checked, e[1] is the correction
    first_token(verifier, "no-trees", prompt, temperature=0.0)
    result = verifier.verify("no-trees", [wrong, e[1], e[2]], None, [-1, -1, 1])
    assert (result.accepted_nodes, result.token_ids) == ([], [e[1]])
    verifier.release("no-trees")
    # the first branch (node 0, then its first child, node 2) holds them: accepted, reported
    # by their indices in the request's tree
    first_token(verifier, "no-trees", prompt, temperature=0.0)
    result = verifier.verify("no-trees", [e[1], wrong, e[2]], None, [-1, -1, 0])
    assert (result.accepted_nodes, result.token_ids) == ([0, 2], [e[1], e[2], e[3]])
    verifier.release("no-trees")
