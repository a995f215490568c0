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
  kept (the key after a closing quote, say) is drafted after it, the same way, and the drafter
  drafts on after that (the value after the key), up to MAX_PARTS drafter parts a round.

Sampled drafts are not pruned: rejection sampling corrects against the q each draft was drawn
from, and dropping the drafts that q drew into forbidden tokens would change what it corrects
against. Forced tokens are point masses there too, accepted with certainty.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

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
        extend: Extend | None = None,
    ) -> DraftProposal:
        """The round's draft: the forced tokens, then what the drafter proposed after them
        (pruned to what the grammar allows, unless sampled), then the tokens forced after its
        likeliest path, and, with `extend` (the drafter's draft after given tokens), what it
        drafts after those, and so on, up to MAX_PARTS drafter parts; `limit` positions deep
        and `max_nodes` tokens at most (the likeliest kept)."""
        if sampled:  # no pruning, no forced tail: the drafter's q must stay as drawn
            return _likeliest(_attach(forced, len(forced.token_ids) - 1, drafted, True), max_nodes)
        draft, anchor, part = forced, len(forced.token_ids) - 1, drafted
        for parts in range(1, MAX_PARTS + 1):
            draft = _attach(draft, anchor, self._pruned(part, _tokens_to(draft, anchor)))
            path = _likeliest_path(draft)
            tokens = [draft.token_ids[i] for i in path]
            room = min(limit - len(path), max_nodes - len(draft.token_ids))
            tail = _forced_chain(*self.matcher.forced_after(tokens), room) if room > 0 else None
            if tail is None or not tail.token_ids:
                break
            draft = _attach(draft, path[-1] if path else -1, tail)
            if extend is None or parts == MAX_PARTS:
                break
            anchor = len(draft.token_ids) - 1
            part = extend([*tokens, *tail.token_ids])
        return _likeliest(draft, max_nodes)

    def _pruned(self, part: DraftProposal, prefix: list[int]) -> DraftProposal:
        """The nodes of the drafter's part whose path the grammar allows after prefix."""
        if not part.token_ids:
            return part
        parents = part.parents or list(range(-1, len(part.token_ids) - 1))
        kept = self.matcher.valid_nodes(part.token_ids, parents, prefix=prefix)
        return part if len(kept) == len(part.token_ids) else part.select(kept)


Extend = Callable[[list[int]], DraftProposal]  # tokens after the context -> the draft after them
MAX_PARTS = 3  # drafter parts a round's draft joins at most (the first and two after tails)


def _forced_chain(certain: list[int], likely: list[int], limit: int) -> DraftProposal:
    """A chain of forced tokens, certain then likely, `limit` at most, with their confidences
    as path probabilities."""
    tokens = [*certain, *likely][:limit]
    probs, prob = [], 1.0
    for i in range(len(tokens)):
        prob *= 1.0 if i < len(certain) else LIKELY
        probs.append(prob)
    return DraftProposal(tokens, sources=[GRAMMAR] * len(tokens), path_probs=probs)


def _attach(
    draft: DraftProposal, after: int, part: DraftProposal, keep_q: bool = False
) -> DraftProposal:
    """The draft with `part` (a chain or a tree) continuing from its node `after` (-1: the
    root), its path probabilities scaled by that node's. keep_q: keep the q's of sampled
    drafts (the draft's own are point masses); else the result carries none (point-mass
    drafts are verified without them)."""
    if not part.token_ids:
        return draft
    if not draft.token_ids:
        return part if keep_q else replace(part, distributions=[])
    n, m = len(draft.token_ids), len(part.token_ids)
    probs, above = _path_probs(draft), 1.0
    if after >= 0:
        above = probs[after]
    chain = not draft.parents and not part.parents and after == n - 1
    parents: list[int] = []
    if not chain:
        own = draft.parents or list(range(-1, n - 1))
        below = part.parents or list(range(-1, m - 1))
        parents = [*own, *(p + n if p >= 0 else after for p in below)]
    distributions: list[SparseDistribution] = []
    if keep_q and part.distributions:
        forced = [SparseDistribution.point_mass(t) for t in draft.token_ids]
        distributions = [*(draft.distributions or forced), *part.distributions]
    return DraftProposal(
        token_ids=[*draft.token_ids, *part.token_ids],
        distributions=distributions,
        matched_orders=[*(draft.matched_orders or [0] * n), *(part.matched_orders or [0] * m)],
        sources=[*(draft.sources or ["graph"] * n), *(part.sources or ["graph"] * m)],
        parents=parents,
        path_probs=[*probs, *(above * p for p in _path_probs(part))],
        seconds=draft.seconds + part.seconds,
    )


def _tokens_to(draft: DraftProposal, node: int) -> list[int]:
    """The tokens on the path from the root to node (none for -1)."""
    path = []
    parents = draft.parents or list(range(-1, len(draft.token_ids) - 1))
    while node >= 0:
        path.append(draft.token_ids[node])
        node = parents[node]
    return path[::-1]


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
