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
  drafts on after that (the value after the key), up to MAX_PARTS drafter parts a round;
- where a JSON string is open, a branch that closes it (its closing quote and what the grammar
  forces after it, confidence CLOSE), since the drafter rarely predicts where a string ends;
- where the string being written is found in the prompt, a copy of the prompt's text after it
  (confidence COPY a token), as far as the grammar allows: extraction copies names and values;
- where the drafter has nothing the grammar allows and the grammar allows few tokens
  (FEW_CHOICES), those tokens as branches, each with what it forces after it.

Sampled drafts are not pruned: rejection sampling corrects against the q each draft was drawn
from, and dropping the drafts that q drew into forbidden tokens would change what it corrects
against. Forced tokens are point masses there too, accepted with certainty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from speculant.grammar import ConstraintMatcher
from speculant.types import DraftProposal, SparseDistribution

GRAMMAR = "grammar"  # the source of forced drafts (DraftProposal.sources)
CLOSE = 0.3  # the confidence that an open string ends here (the first token of its closing)
LIKELY = 0.7  # the confidence of a likely forced token (its share in the dev outputs: 68%)


class ConstrainedDrafts:
    """One request's drafting under its constraint (see the module docstring)."""

    def __init__(self, matcher: ConstraintMatcher, prompt_ids: Sequence[int] = ()) -> None:
        """prompt_ids: the request's prompt, whose text strings may copy (see _copy)."""
        self.matcher = matcher
        self.prompt = matcher.decode(prompt_ids)
        self.text = ""  # the output so far

    def advance(self, token_ids: list[int]) -> None:
        """The tokens the verifier emitted (the constraint allowed each)."""
        self.matcher.consume(token_ids)
        self.text += self.matcher.decode(token_ids)

    def forced(self, limit: int) -> tuple[list[int], list[int]]:
        """What the grammar forces next, (certain, likely), `limit` tokens at most."""
        certain, likely = self.matcher.forced() if limit > 0 else ([], [])
        return certain[:limit], likely[: max(0, limit - len(certain))]

    def assemble(
        self,
        forced: tuple[list[int], list[int]],
        drafted: DraftProposal,
        limits: tuple[int, int],
        sampled: bool = False,
        extend: Extend | None = None,
    ) -> DraftProposal:
        """The round's draft (see the module): the certain forced tokens, then what the drafter
        proposed after them (pruned to what the grammar allows; else the likely forced tokens,
        or the few tokens the grammar allows there), then what the grammar forces after the
        likeliest path, and what `extend` (the drafter after given tokens) drafts after that,
        up to MAX_PARTS parts; limits = (positions deep, tokens) at most, the likeliest kept.
        Sampled drafts: the certain tokens, then the drafter's draft as drawn."""
        certain, likely = forced
        depth, max_nodes = limits
        draft = _chain(certain, 1.0)
        if sampled:  # no pruning, no forced tail: the drafter's q must stay as drawn
            draft = _attach(draft, len(certain) - 1, drafted, True)
            return _likeliest(draft.truncated(depth), max_nodes)
        root = anchor = len(certain) - 1
        closed_at = {root} if certain or likely else set()  # where a closing branch hangs
        part = self._part(drafted, certain, likely)
        for parts in range(1, MAX_PARTS + 1):
            draft = _attach(draft, anchor, part)
            path = _likeliest_path(draft)
            tokens = [draft.token_ids[i] for i in path]
            room = min(depth - len(path), max_nodes - len(draft.token_ids))
            if room <= 0:
                break
            anchor = path[-1] if path else -1
            certain, likely = self.matcher.forced_after(tokens)
            certain = certain[:room]
            if certain:
                draft = _attach(draft, anchor, _chain(certain, 1.0))
                anchor, tokens = len(draft.token_ids) - 1, [*tokens, *certain]
            elif not likely:  # free text next: where the drafter stopped, the string may end
                closed = self._close(draft, anchor, tokens, room)
                if closed is draft or draft.sources[anchor : anchor + 1] == [GRAMMAR]:
                    break  # no string open, or one the grammar has just opened
                closed_at.add(anchor)
                draft, anchor = closed, len(closed.token_ids) - 1
                tokens = _tokens_to(draft, anchor)
            ask = extend is not None and parts < MAX_PARTS and (bool(certain) or not likely)
            part = self._part(extend(tokens) if ask else DraftProposal(), tokens, likely)
        if root not in closed_at:  # inside a string, maybe: that it ends at once is a branch
            draft = self._close(draft, root, [], depth)
        return _likeliest(draft.truncated(depth), max_nodes)

    def _close(self, draft: DraftProposal, at: int, prefix: list[int], room: int) -> DraftProposal:
        """The draft with, after node `at` (prefix: the tokens to it), a branch that closes the
        JSON string open there and goes on with the text the grammar forces after it (its
        first token of confidence CLOSE); the draft itself when no string is open."""
        tokens = self.matcher.closing_after(prefix)[: max(0, room)] if room > 0 else []
        if not tokens:
            return draft
        probs = [CLOSE * LIKELY**i for i in range(len(tokens))]
        closing = DraftProposal(tokens, sources=[GRAMMAR] * len(tokens), path_probs=probs)
        return _attach(draft, at, closing)

    def _part(self, drafted: DraftProposal, prefix: list[int], likely: list[int]) -> DraftProposal:
        """What to draft after prefix: the drafter's draft, pruned, beside a copy of the
        prompt's text where a string being written is found in it; else the fallback."""
        pruned = self._pruned(drafted, prefix)
        copied = self._copy(prefix) if not likely else DraftProposal()
        if pruned.token_ids or copied.token_ids:
            return _attach(pruned, -1, copied) if pruned.token_ids else copied
        return self._fallback(prefix, likely)

    def _copy(self, prefix: list[int]) -> DraftProposal:
        """Where the string being written (the text after the last quote, prefix included)
        ends with text of the prompt (COPY_KEY characters at least): the prompt's text after
        it, up to a quote, bracket or line end (COPY_CHARS at most), as far as the grammar
        allows it; a chain of confidence COPY a token."""
        written = (self.text + self.matcher.decode(prefix)).rpartition('"')
        if not written[1] or len(written[2]) < COPY_KEY:
            return DraftProposal()
        value = written[2]
        for size in range(min(len(value), 4 * COPY_KEY), COPY_KEY - 1, -1):
            found = self.prompt.find(value[-size:])
            if found >= 0:
                break
        else:
            return DraftProposal()
        rest = _COPY_END.split(self.prompt[found + size : found + size + COPY_CHARS], 1)[0]
        tokens = self.matcher.tokenize(rest) if rest else []
        tokens = tokens[: max(0, self.matcher.valid_prefix([*prefix, *tokens]) - len(prefix))]
        probs = [COPY ** (i + 1) for i in range(len(tokens))]
        return DraftProposal(tokens, sources=["overlay"] * len(tokens), path_probs=probs)

    def _pruned(self, part: DraftProposal, prefix: list[int]) -> DraftProposal:
        """The nodes of the drafter's part whose path the grammar allows after prefix."""
        if not part.token_ids:
            return part
        parents = part.parents or list(range(-1, len(part.token_ids) - 1))
        kept = self.matcher.valid_nodes(part.token_ids, parents, prefix=prefix)
        return part if len(kept) == len(part.token_ids) else part.select(kept)

    def _fallback(self, prefix: list[int], likely: list[int]) -> DraftProposal:
        """What to draft after prefix where the drafter has nothing the grammar allows: the
        likely forced tokens, else each of the few tokens the grammar allows (at most
        FEW_CHOICES), with the tokens it forces after each."""
        if likely:
            return _chain(likely, LIKELY)
        choices = self.matcher.few_allowed_after(prefix, FEW_CHOICES)
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        for choice in choices:
            tail = self.matcher.forced_after([*prefix, choice])[0][:MAX_CHOICE_TAIL]
            parents.extend([-1, *range(len(tokens), len(tokens) + len(tail))])
            tokens.extend([choice, *tail])
            probs.extend([1.0 / len(choices)] * (1 + len(tail)))
        if len(choices) == 1:
            parents = []  # a chain
        return DraftProposal(
            tokens, sources=[GRAMMAR] * len(tokens), parents=parents, path_probs=probs
        )


Extend = Callable[[list[int]], DraftProposal]  # tokens after the context -> the draft after them
COPY, COPY_KEY, COPY_CHARS = 0.8, 3, 48  # a copy of the prompt: its confidence, key, length
_COPY_END = re.compile(r'["\n()`]')
MAX_PARTS = 3  # drafter parts a round's draft joins at most (the first and two after tails)
FEW_CHOICES = 8  # where the grammar allows this few tokens, each is drafted (an enum's next)
MAX_CHOICE_TAIL = 16  # forced tokens drafted after each of them


def _chain(tokens: list[int], confidence: float) -> DraftProposal:
    """A chain of forced tokens, each of this confidence given the ones before."""
    probs = [confidence ** (i + 1) for i in range(len(tokens))]
    return DraftProposal(list(tokens), sources=[GRAMMAR] * len(tokens), path_probs=probs)


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
