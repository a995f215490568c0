"""Drafts that know the grammar (gateway.rounds.constrained), on the demo kit's tokenizer: the
forced tokens come first, the drafter's draft is pruned to what the grammar allows, the likely
forced tokens or the few allowed ones stand in where the drafter has nothing, what the grammar
forces after the likeliest path is appended and the drafter asked again after it, and a draft
keeps its depth and node limits."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from gateway.rounds.constrained import GRAMMAR, ConstrainedDrafts
from gateway.rounds.draft_sizing import NodeFeatures, RequestSizer, SizingModel
from speculant.config import DraftParams
from speculant.constraint import Constraint, json_schema_constraint
from speculant.cost_profile import CostProfile
from speculant.grammar import grammars_for
from speculant.types import DraftProposal
from tests.assets import STORIES_MODEL

CARD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "cow"]},
    },
    "required": ["name", "kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(STORIES_MODEL)


@pytest.fixture
def text(tokenizer):
    grammars = grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    return grammars.matcher(Constraint("regex", "a")).tokenize  # the engine's byte-level split


def drafts_for(tokenizer, constraint: Constraint) -> ConstrainedDrafts:
    grammars = grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    return ConstrainedDrafts(grammars.matcher(constraint))


def decoded(tokenizer, draft: DraftProposal, nodes: list[int]) -> str:
    return "".join(tokenizer.decode([draft.token_ids[i]]) for i in nodes)


def test_forced_tokens_come_first_and_the_drafter_goes_on_after_them(tokenizer, text):
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    certain, likely = drafts.forced(64)
    assert tokenizer.decode(certain + likely) == '{"name":"'
    name = DraftProposal(text("Tom"), path_probs=[0.9, 0.8, 0.7][: len(text("Tom"))])
    draft = drafts.assemble((certain, likely), name, (64, 64))
    assert draft.sources[: len(certain)] == [GRAMMAR] * len(certain)
    path = likeliest_path(draft)  # forced, the drafter's name, then a branch that closes it
    assert decoded(tokenizer, draft, path).startswith('{"name":"Tom","kind":"')
    assert not any(p == len(certain) - 1 for p in draft.parents[len(certain) + 3 :])
    assert draft.path_probs[: len(certain)] == [1.0] * len(certain)


def test_a_forbidden_draft_is_pruned_and_the_likely_tokens_stand_in(tokenizer, text):
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    drafts.advance(text('{"name":"Tom'))
    certain, likely = drafts.forced(64)
    assert not certain and not likely  # inside a free string
    junk = DraftProposal(text("\n\n"), path_probs=[0.9, 0.8])  # no raw newline in a string
    draft = drafts.assemble((certain, likely), junk, (64, 64))
    assert junk.token_ids[0] not in draft.token_ids  # pruned: never verified
    assert decoded(tokenizer, draft, range(len(draft.token_ids))).startswith('","kind":"')
    closing = DraftProposal(text('"'), path_probs=[0.9])
    draft = drafts.assemble(([], []), closing, (64, 64))
    assert tokenizer.decode(draft.token_ids).startswith('","kind":"')  # the key is forced after


def test_where_few_tokens_are_allowed_each_is_drafted(tokenizer, text):
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    drafts.advance(text('{"name":"Tom","kind":"'))
    draft = drafts.assemble(drafts.forced(64), DraftProposal(), (64, 64))
    roots = [i for i, p in enumerate(draft.parents) if p == -1]
    assert len(roots) >= 2  # the enum's first letters, one branch each
    branches = {decoded(tokenizer, draft, [i, *children(draft, i)]) for i in roots}
    assert {"cat", "dog", "cow"} & {b.rstrip('"}') for b in branches}
    assert all(s == GRAMMAR for s in draft.sources)


def likeliest_path(draft: DraftProposal) -> list[int]:
    """The nodes from the root to the draft's likeliest leaf (by path probability, then the
    deepest)."""
    parents, probs, depths = draft.parents, draft.path_probs, draft.depths()
    if not parents:  # a chain
        return list(range(len(draft.token_ids)))
    leaves = [i for i in range(len(draft.token_ids)) if i not in parents]
    node, path = max(leaves, key=lambda i: (probs[i], depths[i])), []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def children(draft: DraftProposal, node: int) -> list[int]:
    """The chain below node (each node's only child), in order."""
    out = []
    while True:
        below = [i for i, p in enumerate(draft.parents) if p == node]
        if not below:
            return out
        node = below[0]
        out.append(node)


def test_the_drafter_is_asked_again_after_a_forced_tail(tokenizer, text):
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    drafts.advance(text('{"name":"'))
    asked: list[str] = []

    def extend(tokens: list[int]) -> DraftProposal:
        asked.append(tokenizer.decode(tokens))
        return DraftProposal(text("dog"), path_probs=[0.5] * len(text("dog")))

    name = DraftProposal(text('Rex"'), path_probs=[0.9] * len(text('Rex"')))
    draft = drafts.assemble(([], []), name, (64, 64), extend=extend)
    assert asked and asked[0].endswith('","kind":"')
    assert tokenizer.decode(draft.token_ids).startswith('Rex","kind":"dog')


def test_a_draft_keeps_its_depth_and_node_limits(tokenizer, text):
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    draft = drafts.assemble(drafts.forced(3), DraftProposal(), (3, 64))
    assert len(draft.token_ids) == 3
    tree = DraftProposal(text("abcdef"), parents=[-1, 0, 0, 1, 1, 2], path_probs=[0.9] * 6)
    drafts.advance(text('{"name":"'))
    draft = drafts.assemble(([], []), tree, (64, 4))
    assert len(draft.token_ids) == 4


def test_sampled_drafts_are_kept_as_drawn(tokenizer, text):
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    drafts.advance(text('{"name":"Tom'))
    junk = DraftProposal(text("\n\n"))
    draft = drafts.assemble(([], []), junk, (64, 64), sampled=True)
    assert (
        draft.token_ids == junk.token_ids
    )  # not pruned: its q must stay the one it was drawn from


def test_the_sizer_ranks_certain_forced_tokens_first(tokenizer):
    """Forced tokens form a calibration group of their own, whose prior is certainty."""
    drafts = drafts_for(tokenizer, json_schema_constraint(CARD))
    draft = drafts.assemble(drafts.forced(64), DraftProposal(), (64, 64))
    sizer = RequestSizer(SizingModel(CostProfile.flat()), DraftParams(tree_nodes=0))
    assert len(draft.token_ids) >= 3 and draft.path_probs == [1.0] * len(draft.token_ids)
    survival = sizer.acceptance.survival(NodeFeatures.of(draft))
    assert survival[0] > 0.99 and survival[-1] > 0.95  # each forced token all but certain


def test_a_string_found_in_the_prompt_is_copied_on(tokenizer, text):
    """Writing a string whose end is text of the prompt: the prompt's text after it is drafted
    (tokenized as the string needs it, without the prompt's word-leading spaces)."""
    grammars = grammars_for(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    prompt = tokenizer("The dog was called Rexford the Brave. He ran.").input_ids
    drafts = ConstrainedDrafts(grammars.matcher(json_schema_constraint(CARD)), prompt)
    drafts.advance(text('{"name":"Rexf'))
    draft = drafts.assemble(([], []), DraftProposal(), (64, 64))
    copied = [t for t, s in zip(draft.token_ids, draft.sources, strict=True) if s == "overlay"]
    assert drafts.matcher.decode(copied) == "ord the"  # as far as maxLength 12 allows
