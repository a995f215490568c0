"""Drafts that know the request's constraint (speculant.grammar).

The verifier masks every position it verifies, so the output keeps to the constraint whatever
is drafted: exactness is its job. The coordinator keeps a matcher of its own, at the state
after the tokens emitted so far, to draft what the grammar allows and nothing else:

- *forced* tokens first: where the grammar allows one continuation text, the tokens its mask
  allows alone are drafted as certain (source "grammar", confidence 1: the sizer ranks them
  first), and the canonical tokens of the rest of that text as likely (confidence LIKELY: the
  model may split the text otherwise); the drafter continues after them;
- no forward on a forbidden token: of the drafter's point-mass draft, only the nodes whose path
  the grammar allows are kept (a forbidden node would be rejected for certain);
- forced tokens after the draft: what the grammar forces after the likeliest path of what is
  kept (the key after a closing quote, say) is drafted after it, the same way.

Sampled drafts are not pruned: rejection sampling corrects against the q each draft was drawn
from, and dropping the drafts that q drew into forbidden tokens would change what it corrects
against. Forced tokens are point masses there too, accepted with certainty.
"""

from __future__ import annotations

from speculant.grammar import ConstraintMatcher
from speculant.types import DraftProposal, SparseDistribution

GRAMMAR = "grammar"  # the source of forced drafts (DraftProposal.sources)
LIKELY = 0.7  # the confidence of a likely forced token (its share in the dev outputs: 68%)


class ConstrainedDrafts:
    """One request's drafting under its constraint (see the module docstring)."""

    def __init__(self, matcher: ConstraintMatcher) -> None:
        self.matcher = matcher

    def advance(self, token_ids: list[int]) -> None:
        """The tokens the verifier emitted (the constraint allowed each)."""
        self.matcher.consume(token_ids)

    def forced(self, limit: int) -> DraftProposal:
        """What the grammar forces next, a chain of at most `limit` tokens (see the module)."""
        return _forced_chain(*self.matcher.forced(), limit) if limit > 0 else DraftProposal()

    def assemble(
        self,
        forced: DraftProposal,
        drafted: DraftProposal,
        limit: int,
        sampled: bool,
        max_nodes: int,
    ) -> DraftProposal:
        """The round's draft: the forced tokens, then what the drafter proposed after them
        (pruned to what the grammar allows, unless sampled), then the tokens forced after its
        likeliest path; `limit` positions deep and `max_nodes` tokens at most (the likeliest
        kept)."""
        if not sampled and drafted.token_ids:
            parents = drafted.parents or list(range(-1, len(drafted.token_ids) - 1))
            kept = self.matcher.valid_nodes(drafted.token_ids, parents, prefix=forced.token_ids)
            if len(kept) < len(drafted.token_ids):
                drafted = drafted.select(kept)
        draft = _graft(forced, drafted)
        if not sampled:
            path = _likeliest_path(draft)
            room = limit - len(path)
            if room > 0:
                tokens = [draft.token_ids[i] for i in path]
                tail = _forced_chain(*self.matcher.forced_after(tokens), room)
                if tail.token_ids:
                    draft = _append(draft, path[-1] if path else -1, tail)
        return _likeliest(draft, max_nodes)


def _forced_chain(certain: list[int], likely: list[int], limit: int) -> DraftProposal:
    """A chain of forced tokens, certain then likely, `limit` at most, with their confidences
    as path probabilities."""
    tokens = [*certain, *likely][:limit]
    probs, prob = [], 1.0
    for i in range(len(tokens)):
        prob *= 1.0 if i < len(certain) else LIKELY
        probs.append(prob)
    return DraftProposal(tokens, sources=[GRAMMAR] * len(tokens), path_probs=probs)


def _graft(forced: DraftProposal, drafted: DraftProposal) -> DraftProposal:
    """The forced chain, with the drafted tree (or chain) continuing from its last token."""
    if not forced.token_ids:
        return drafted
    n, count = len(forced.token_ids), len(drafted.token_ids)
    parents: list[int] = []
    if drafted.parents:  # a tree: its roots hang from the last forced token
        parents = [*range(-1, n - 1), *(p + n if p >= 0 else n - 1 for p in drafted.parents)]
    below = forced.path_probs[-1]
    return DraftProposal(
        token_ids=[*forced.token_ids, *drafted.token_ids],
        distributions=(
            [*map(SparseDistribution.point_mass, forced.token_ids), *drafted.distributions]
            if drafted.distributions
            else []
        ),
        matched_orders=[*([0] * n), *drafted.matched_orders] if drafted.matched_orders else [],
        sources=[*forced.sources, *(drafted.sources or ["graph"] * count)],
        parents=parents,
        path_probs=[*forced.path_probs, *(below * p for p in _path_probs(drafted))],
        seconds=drafted.seconds,
    )


def _path_probs(draft: DraftProposal) -> list[float]:
    """The draft's path probabilities (0.5 a level where a drafter reported none)."""
    n = len(draft.token_ids)
    if len(draft.path_probs) == n:
        return list(draft.path_probs)
    return [0.5 ** (depth + 1) for depth in draft.depths()]


def _likeliest(draft: DraftProposal, max_nodes: int) -> DraftProposal:
    """The draft's max_nodes likeliest tokens (by path probability, then position: a set that
    keeps every kept token's parent, since a path probability never grows along a path)."""
    n = len(draft.token_ids)
    if n <= max_nodes:
        return draft
    probs = _path_probs(draft)
    keep = sorted(sorted(range(n), key=lambda i: (-probs[i], i))[: max(0, max_nodes)])
    return draft.select(keep)


def _likeliest_path(draft: DraftProposal) -> list[int]:
    """The nodes from the root to the draft's likeliest leaf (a chain: all of them)."""
    n = len(draft.token_ids)
    if not draft.parents:
        return list(range(n))
    if not n:
        return []
    has_child = [False] * n
    for parent in draft.parents:
        if parent >= 0:
            has_child[parent] = True
    probs, depths = _path_probs(draft), draft.depths()
    leaf = max((i for i in range(n) if not has_child[i]), key=lambda i: (probs[i], depths[i]))
    path = []
    while leaf >= 0:
        path.append(leaf)
        leaf = draft.parents[leaf]
    return path[::-1]


def _append(draft: DraftProposal, after: int, tail: DraftProposal) -> DraftProposal:
    """The draft with a forced chain after node `after` (-1: the root)."""
    n, tokens = len(draft.token_ids), tail.token_ids
    m = len(tokens)
    chain = not draft.parents and after == n - 1
    probs = _path_probs(draft)
    above = probs[after] if after >= 0 else 1.0
    return DraftProposal(
        token_ids=[*draft.token_ids, *tokens],
        distributions=[*draft.distributions, *map(SparseDistribution.point_mass, tokens)]
        if draft.distributions
        else [],
        matched_orders=[*draft.matched_orders, *([0] * m)] if draft.matched_orders else [],
        sources=[*(draft.sources or ["graph"] * n), *tail.sources],
        parents=[] if chain else [*draft.parents, after, *range(n, n + m - 1)],
        path_probs=[*probs, *(above * p for p in tail.path_probs)],
        seconds=draft.seconds,
    )
