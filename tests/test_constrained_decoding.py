"""Constrained decoding is exact: under a constraint (speculant.grammar) greedy speculative output
is token-identical to Hugging Face ``generate`` with the engine's logits processor
(ConstraintLogitsProcessor), embedded and over the services, with chains, trees, every drafted
node verified or the cost-aware cut; in one verify batch with unconstrained sessions; and the
drafts know the grammar (forced tokens drafted, forbidden ones never verified)."""

from __future__ import annotations

import grpc
import pytest
import torch

from gateway.generation import GenerationRequest
from speculant.config import (
    DraftConfig,
    DraftParams,
    GenerationConfig,
    SessionOptions,
    VerifierConfig,
)
from speculant.constraint import Constraint, json_schema_constraint
from speculant.errors import InvalidArgumentError
from speculant.grammar import ConstraintLogitsProcessor, grammars_for
from speculant.types import DraftProposal
from speculant.v1 import gateway_pb2
from speculant.wire import constraint_to_pb
from tests.assets import STORIES_MODEL, load_dev_prompts
from tests.concurrency import hold_first_batch, run_threads
from verifier_service.verifier import LocalVerifier

MAX_TOKENS = 64
CARD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "friends": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "happy": {"type": "boolean"},
    },
    "required": ["name", "age", "friends", "happy"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "json_schema": json_schema_constraint(CARD),
    "json_object": Constraint("json_object"),
    "regex": Constraint("regex", r"[A-Z][a-z]+( [a-z]+){3,20}\."),
    "choice": Constraint("choice", choices=("yes", "no", "Once upon a time")),
    "grammar": Constraint(
        "grammar", 'start: sentence+\nsentence: WORD (" " WORD)* ". "\nWORD: /[A-Za-z]+/'
    ),
}
DRAFTS = {
    "default": DraftConfig(),  # cost-aware sizes of a tree
    "chain": DraftConfig(draft_size="fixed", tree_nodes=0),
    "tree": DraftConfig(draft_size="fixed"),
}


def hf_constrained(decoder, prompt_ids: list[int], constraint: Constraint, n: int) -> list[int]:
    """Hugging Face greedy generate with the constraint's logits processor (no final EOS)."""
    tokenizer, info = decoder.tokenizer, decoder.verifier.info
    matcher = grammars_for(tokenizer, info.vocab_size, info.eos_token_ids).matcher(constraint)
    with torch.inference_mode():
        out = decoder.verifier.model.model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=info.eos_token_ids,
            logits_processor=[ConstraintLogitsProcessor(matcher)],
        )
    tokens = out[0, len(prompt_ids) :].tolist()
    return tokens[:-1] if tokens and tokens[-1] in info.eos_token_ids else tokens


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return load_dev_prompts(2)


@pytest.fixture(scope="module")
def references(embedded_decoder, prompts) -> dict[str, list[list[int]]]:
    tokenizer = embedded_decoder.tokenizer
    return {
        name: [
            hf_constrained(embedded_decoder, tokenizer(p).input_ids, c, MAX_TOKENS) for p in prompts
        ]
        for name, c in CONSTRAINTS.items()
    }


@pytest.mark.parametrize("draft", sorted(DRAFTS))
@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_greedy_output_is_hugging_face_with_the_constraint(
    embedded_decoder, prompts, references, name, draft
):
    generation = GenerationConfig(
        max_tokens=MAX_TOKENS, temperature=0.0, constraint=CONSTRAINTS[name]
    )
    for prompt, expected in zip(prompts, references[name], strict=True):
        result = embedded_decoder.generate(
            prompt=prompt, generation_config=generation, draft_config=DRAFTS[draft]
        )
        assert result.token_ids == expected, f"{name} / {draft}: differs from HF + the mask"


def test_a_learning_decoder_stays_exact_and_drafts_the_forced_tokens(
    learning_decoder, prompts, references
):
    """The decoder as users get it (it learns from each generation): the same outputs, and the
    keys the schema forces are drafted (and accepted) instead of decoded one by one."""
    generation = GenerationConfig(
        max_tokens=MAX_TOKENS, temperature=0.0, constraint=CONSTRAINTS["json_schema"]
    )
    for _ in range(2):  # the second pass drafts from what the first one taught
        for prompt, expected in zip(prompts, references["json_schema"], strict=True):
            result = learning_decoder.generate(prompt=prompt, generation_config=generation)
            assert result.token_ids == expected
            assert result.stats.accepted_from_grammar >= 10
            assert result.stats.rounds < len(expected)


def test_greedy_output_over_the_services_is_hugging_face_with_the_constraint(
    services, embedded_decoder, prompts, references
):
    for name in ("json_schema", "regex", "grammar"):
        for prompt, expected in zip(prompts, references[name], strict=True):
            request = gateway_pb2.GenerateRequest(
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                constraint=constraint_to_pb(CONSTRAINTS[name]),
            )
            response = services.gateway.Generate(request, timeout=60)
            assert list(response.token_ids) == expected, f"{name} over the services"
            if name == "json_schema":
                assert response.stats.accepted_from_grammar > 0


def test_a_constraint_that_does_not_compile_is_refused_before_any_work(services):
    request = gateway_pb2.GenerateRequest(
        prompt="Once upon a time",
        constraint=constraint_to_pb(json_schema_constraint({"type": "array", "uniqueItems": 1})),
    )
    with pytest.raises(grpc.RpcError) as caught:
        services.gateway.Generate(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "constraint.json_schema" in caught.value.details()
    assert "uniqueItems" in caught.value.details()


def test_max_tokens_inside_a_value_finishes_with_max_tokens(embedded_decoder, prompts):
    generation = GenerationConfig(
        max_tokens=12, temperature=0.0, constraint=CONSTRAINTS["json_schema"]
    )
    result = embedded_decoder.generate(prompt=prompts[0], generation_config=generation)
    assert result.finish_reason == "max_tokens"
    assert len(result.token_ids) == 12 and result.text.startswith('{"name":"')


def test_forbidden_drafts_are_never_verified(embedded_decoder, prompts, references, monkeypatch):
    """A drafter whose every draft ends in junk the grammar forbids: the coordinator cuts those
    nodes before the verifier sees them (each Verify's chain is allowed where it is sent), and
    the output does not change."""
    coordinator = embedded_decoder.coordinator
    constraint = CONSTRAINTS["regex"]
    tokenizer, info = embedded_decoder.tokenizer, embedded_decoder.verifier.info
    tracker = grammars_for(tokenizer, info.vocab_size, info.eos_token_ids).matcher(constraint)
    junk = tokenizer.convert_tokens_to_ids("X")  # an upper-case letter: never after the first
    proposed, sent = [], []
    original_propose, original_verify = coordinator.drafter.propose, coordinator.verifier.verify

    def junk_propose(context, params, seed=None):
        proposal = original_propose(context, params, seed)
        proposal = DraftProposal([*proposal.token_ids, junk, junk])
        proposed.append(proposal.token_ids)
        return proposal

    def checked_verify(session_id, draft_ids, *args, **kwargs):
        sent.append((tracker.valid_prefix(list(draft_ids)), len(draft_ids)))
        result = original_verify(session_id, draft_ids, *args, **kwargs)
        tracker.consume(result.token_ids)
        return result

    monkeypatch.setattr(coordinator.drafter, "propose", junk_propose)
    monkeypatch.setattr(coordinator.verifier, "verify", checked_verify)
    prompt_ids = tokenizer(prompts[0]).input_ids
    first = hf_constrained(embedded_decoder, prompt_ids, constraint, 1)
    tracker.consume(first)
    request = GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        draft=DraftParams(k=8, tree_nodes=0, draft_size="fixed"),
        constraint=constraint,
    )
    result = coordinator.generate(request)
    assert result.token_ids == references["regex"][0]
    assert proposed and all(junk in p for p in proposed)
    assert sent and all(valid == length for valid, length in sent), sent


def test_the_verifier_forwards_no_forbidden_draft(loaded):
    """A Verify whose chain turns forbidden after two tokens runs its forward over those two
    only (the verifier's own check, for callers other than this gateway)."""
    verifier = LocalVerifier(VerifierConfig(model_name=str(STORIES_MODEL)), model=loaded)
    try:
        tokenizer = loaded.tokenizer
        digits = [tokenizer.convert_tokens_to_ids(d) for d in "1234"]
        options = SessionOptions(temperature=0.0, constraint=Constraint("regex", "[0-9]{6}"))
        verifier.start("s", tokenizer("The number is").input_ids, options)
        before = verifier.stats().draft_tokens
        letter = tokenizer.convert_tokens_to_ids("a")
        result = verifier.verify("s", [digits[0], digits[1], letter, digits[2]])
        assert verifier.stats().draft_tokens - before == 2
        assert all(tokenizer.decode([t]).isdigit() for t in result.token_ids)
    finally:
        verifier.close()


def test_constrained_and_free_sessions_share_a_verify_batch(loaded, prompts):
    """Three constrained and three free sessions verify concurrently (the batcher puts their
    chains in one forward): each is token-identical to Hugging Face, with or without its
    mask."""
    verifier = LocalVerifier(
        VerifierConfig(model_name=str(STORIES_MODEL), max_batch=8), model=loaded
    )
    tokenizer = loaded.tokenizer
    constraint = CONSTRAINTS["json_schema"]
    grammars = grammars_for(tokenizer, loaded.vocab_size, loaded.eos_token_ids)
    cases = []
    for i in range(6):
        prompt = tokenizer(prompts[i % 2]).input_ids
        constrained = i % 2 == 0
        processors = (
            [ConstraintLogitsProcessor(grammars.matcher(constraint))] if constrained else []
        )
        with torch.inference_mode():
            out = loaded.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=24,
                min_new_tokens=24,
                do_sample=False,
                pad_token_id=0,
                logits_processor=processors,
            )
        cases.append((prompt, out[0, len(prompt) :].tolist(), constrained))
    assert verifier.batcher is not None
    hold_first_batch(verifier.batcher, 5)
    outputs: dict[int, list[int]] = {}

    def session(i: int) -> None:
        prompt, ref, constrained = cases[i]
        options = SessionOptions(temperature=0.0, constraint=constraint if constrained else None)
        out = verifier.start(f"b{i}", prompt, options).token_ids
        while len(out) < len(ref):
            out += verifier.verify(f"b{i}", ref[len(out) : len(out) + 3]).token_ids
        outputs[i] = out[: len(ref)]

    try:
        run_threads(session, 6)
    finally:
        verifier.close()
    for i, (_, ref, constrained) in enumerate(cases):
        assert outputs[i] == ref, f"session {i} (constrained: {constrained})"
    assert verifier.batcher.largest >= 5


def test_a_constraint_is_refused_with_the_field_in_the_library(embedded_decoder):
    generation = GenerationConfig(constraint=Constraint("regex", "(unclosed"))
    with pytest.raises(InvalidArgumentError) as caught:
        embedded_decoder.generate(prompt="Once upon a time", generation_config=generation)
    assert caught.value.field == "constraint.regex"
