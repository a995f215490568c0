"""The grammar engine (speculant.grammar) on the demo kit's tokenizer: constraints compile or
fail with the field and the engine's reason, compiled constraints are cached, masks follow the
output, forced tokens are what the mask allows alone, and draft trees are checked path by path."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from speculant.constraint import MAX_CONSTRAINT_CHARS, Constraint, json_schema_constraint
from speculant.errors import InvalidArgumentError
from speculant.grammar import ConstraintLogitsProcessor, Grammars, grammars_for
from tests.assets import SMOLLM2_MODEL, STORIES_MODEL, needs

CARD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "happy": {"type": "boolean"},
    },
    "required": ["name", "happy"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(STORIES_MODEL)


@pytest.fixture(scope="module")
def grammars(tokenizer) -> Grammars:
    return grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def tokens(grammars: Grammars, text: str) -> list[int]:
    """The text's tokens as the engine splits forced text (byte-level, no prefix space)."""
    return grammars.matcher(Constraint("regex", "a")).tokenize(text)


def allowed_texts(matcher, tokenizer) -> set[str]:
    return {tokenizer.decode([t]) for t in matcher.allowed().nonzero().flatten().tolist()}


@pytest.mark.parametrize(
    ("constraint", "field", "reason"),
    [
        (Constraint("regex", "(a"), "constraint.regex", "unclosed group"),
        (Constraint("json_schema", "{"), "constraint.json_schema", "not valid JSON"),
        (Constraint("json_schema", "[1]"), "constraint.json_schema", "a JSON schema is an object"),
        (
            json_schema_constraint({"type": "array", "uniqueItems": True}),
            "constraint.json_schema",
            'Unimplemented keys: ["uniqueItems"]',
        ),
        (Constraint("grammar", "start: undefined_rule"), "constraint.grammar", "unknown name"),
        (Constraint("choice"), "constraint.choice", "give 1 to"),
        (Constraint("choice", choices=("a", "")), "constraint.choice", "must not be empty"),
        (Constraint("regex", ""), "constraint.regex", "must not be empty"),
        (Constraint("regex", "a" * (MAX_CONSTRAINT_CHARS + 1)), "constraint.regex", "at most"),
    ],
)
def test_a_bad_constraint_names_its_field_and_the_reason(grammars, constraint, field, reason):
    with pytest.raises(InvalidArgumentError) as caught:
        grammars.matcher(constraint)
    assert caught.value.field == field
    assert reason in caught.value.problem
    assert "\n" not in str(caught.value)  # one line, without the engine's source excerpt


@needs(SMOLLM2_MODEL)
def test_a_pathological_regex_is_stopped_by_the_work_limit():
    """A regex whose automaton over a 49k vocabulary explodes fails at compile (the engine's
    lexer fuel), with the reason: it cannot stall a generation's steps."""
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_MODEL)
    grammars = grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    with pytest.raises(InvalidArgumentError) as caught:
        grammars.matcher(Constraint("regex", "(.{0,100}){0,100}x"))
    assert caught.value.field == "constraint.regex"
    assert "too many" in caught.value.problem


def compilations(monkeypatch) -> list[Constraint]:
    """The constraints compiled from now on (each compile writes its grammar once)."""
    import speculant.grammar as grammar

    compiled: list[Constraint] = []
    write = grammar.llguidance_grammar

    def counting(constraint: Constraint) -> str:
        compiled.append(constraint)
        return write(constraint)

    monkeypatch.setattr(grammar, "llguidance_grammar", counting)
    return compiled


def test_compiled_constraints_are_cached_and_each_generation_gets_its_own_state(
    tokenizer, monkeypatch
):
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiled = compilations(monkeypatch)
    constraint = json_schema_constraint(CARD)
    first, second = grammars.matcher(constraint), grammars.matcher(constraint)
    assert compiled == [constraint]  # compiled once, for both
    first.consume(first.forced()[0])
    assert first.forced() != second.forced()  # advancing one does not move the other


def test_the_cache_is_bounded(tokenizer, monkeypatch):
    import speculant.grammar as grammar

    monkeypatch.setattr(grammar, "COMPILED_KEPT", 3)
    grammars = Grammars(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    constraints = [Constraint("regex", f"a{{{n + 1}}}") for n in range(5)]
    for constraint in constraints:
        grammars.matcher(constraint)
    compiled = compilations(monkeypatch)
    for constraint in constraints[2:]:  # the last three kept
        grammars.matcher(constraint)
    assert compiled == []
    grammars.matcher(constraints[0])  # the oldest dropped: compiled again
    assert compiled == [constraints[0]]


def test_a_json_schema_forces_its_keys_and_masks_what_it_forbids(grammars, tokenizer):
    matcher = grammars.matcher(json_schema_constraint(CARD))
    certain, likely = matcher.forced()
    assert tokenizer.decode(certain + likely).startswith('{"name":"')
    for token in certain:  # a certain token is the only one its position allows
        assert matcher.allowed().sum() == 1 and matcher.allows(token)
        matcher.consume([token])
    matcher.consume(likely)
    assert not matcher.allows(tokenizer.eos_token_id)  # the object is not complete
    matcher.consume(tokens(grammars, 'Sue","happy":'))
    assert allowed_texts(matcher, tokenizer) <= {"t", "f", "tr", "fa", "true", "false"}
    matcher.consume(tokens(grammars, "true}"))
    assert matcher.stopped
    assert matcher.allowed().nonzero().flatten().tolist() == [tokenizer.eos_token_id]


def test_a_choice_allows_only_the_choices(grammars, tokenizer):
    matcher = grammars.matcher(Constraint("choice", choices=("yes", "no")))
    assert {text[:1] for text in allowed_texts(matcher, tokenizer)} <= {"y", "n"}


def test_valid_nodes_keeps_the_paths_the_grammar_allows(grammars, tokenizer):
    matcher = grammars.matcher(Constraint("regex", "ab(c|d)+"))
    a, b, c, d, x = (tokenizer.convert_tokens_to_ids(t) for t in "abcdx")
    # 0:a -> 1:b -> 2:c -> 3:x(forbidden) ; 1:b -> 4:d ; root -> 5:x (forbidden) -> 6:a
    tokens = [a, b, c, x, d, x, a]
    parents = [-1, 0, 1, 2, 1, -1, 5]
    assert matcher.valid_nodes(tokens, parents) == [0, 1, 2, 4]
    assert matcher.valid_nodes([c, x], [-1, 0], prefix=[a, b]) == [0]
    assert matcher.valid_prefix([a, b, c, x, d]) == 3


def test_the_logits_processor_masks_hugging_face_generate(grammars, tokenizer):
    """ConstraintLogitsProcessor follows the tokens generate appends, one call a token."""
    processor = ConstraintLogitsProcessor(grammars.matcher(Constraint("regex", "[0-9]+")))
    prompt = torch.tensor([[1, 2, 3]])
    scores = processor(prompt, torch.zeros(1, len(tokenizer)))  # [1, V]
    digits = {tokenizer.decode([t]) for t in torch.isfinite(scores[0]).nonzero().flatten()}
    assert digits and all(text.isdigit() for text in digits)
    seven = tokenizer.convert_tokens_to_ids("7")
    scores = processor(torch.tensor([[1, 2, 3, seven]]), torch.zeros(1, len(tokenizer)))
    assert torch.isfinite(scores[0, tokenizer.eos_token_id])  # "7" is a whole number


def test_grammars_are_shared_per_tokenizer(tokenizer, grammars):
    assert grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id]) is grammars
    json.dumps(CARD)  # the schema is plain JSON
