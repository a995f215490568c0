"""Calibrated acceptance: how likely the target is to accept each draft token, learned online.

Terms (draft trees; a chain is a tree where token i's parent is token i - 1):
- a node's *confidence* is the drafter's q of its token given its parent,
  ``path_probs[i] / path_probs[parent]`` (speculant.types.DraftProposal);
- its *group* is ``context`` when the request's own context listed its token (source "overlay"
  or "both", see draft_service.overlay), ``grammar`` when the request's constraint forced it
  (gateway.rounds.constrained: the target emits it with certainty), else ``graph`` (the graph or
  the live layer alone);
- a node is *tried* when the target's output reached its parent (or it follows the context
  directly) and *accepted* when the target emitted its token there;
- its *survival* is the chance that the whole path to it is accepted: the product of the
  calibrated acceptance of its ancestors and itself.

Calibration counts tried and accepted nodes per (group, confidence bin). It learns from what the
target actually emitted, verified or not: with point-mass (greedy) drafts the verifier emits a
plain draw from p at every position whatever the draft (sample-and-match), so every drafted
node, also the ones the sizer cut before verification, is resolved exactly against the emitted
tokens (:class:`PendingDrafts`). (For sampled drafts, verified by rejection sampling against q,
the same match is a conservative estimate: a sampled draft is accepted at least as often as an
independent draw from p equals it.)

Estimates: shared by every request of a coordinator, rate(g, b) = (accepted + PRIOR_WEIGHT f0) /
(tried + PRIOR_WEIGHT), where the prior f0 is the bin's mid confidence times GROUP_PRIOR[g]
(measured on SmolLM2 chat answers: corpus-only drafts are accepted about half as often as their q
says; context drafts about as often); counts are halved past COUNT_CAP, so the estimate follows
a changing workload. Each request keeps its own counts on top: (a_r + REQUEST_WEIGHT rate) /
(t_r + REQUEST_WEIGHT), so a request whose text the graph knows well (or badly) is seen as such
after a few rounds. A request hands its counts to the shared estimate every SHARE_EVERY rounds
(and when it ends): the shared table's lock and refresh are then paid a few times a request, not
every round.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from speculant.types import DraftProposal

# Upper edges of the confidence bins (the last bin is [0.99, 1]).
BIN_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
BINS = len(BIN_EDGES) + 1
_LOWS = (0.0, *BIN_EDGES)
_HIGHS = (*BIN_EDGES, 1.0)
MID_CONFIDENCE = tuple((lo + hi) / 2 for lo, hi in zip(_LOWS, _HIGHS, strict=True))
GRAPH, CONTEXT, GRAMMAR = 0, 1, 2  # groups
GROUP_PRIOR = (0.6, 0.9, 1.0)  # acceptance / confidence before any observation, by group
_GROUP_OF_SOURCE = {"overlay": CONTEXT, "both": CONTEXT, "grammar": GRAMMAR}
PRIOR_WEIGHT = 20.0  # pseudo-observations of the prior in the shared estimate
REQUEST_WEIGHT = 8.0  # pseudo-observations of the shared estimate in a request's own
COUNT_CAP = 4000.0  # a bin's shared counts are halved past this many tried nodes
MAX_RATE = 0.999  # a survival never reaches 1, so a child never outranks its parent
SHARE_EVERY = 8  # rounds of a request between two hand-overs of its counts
MAX_PENDING = 64  # drafts of one request awaiting their outcome (older ones are dropped)
Counts = dict[tuple[int, int], list[int]]  # (group, bin) -> [tried, accepted]


def confidence_bin(confidence: float) -> int:
    """The bin of a node's confidence (BIN_EDGES are the bins' upper edges)."""
    return bisect.bisect_right(BIN_EDGES, confidence)


@dataclass(frozen=True)
class NodeFeatures:
    """What calibration needs of each node of a draft: its parent (a chain's i - 1), its group
    (CONTEXT when the request's context listed its token) and its confidence bin (from its path
    probability over its parent's; 0.5 for a draft without path probabilities, from an older
    draft service)."""

    parents: list[int]
    groups: list[int]
    bins: list[int]

    @classmethod
    def of(cls, proposal: DraftProposal) -> NodeFeatures:
        n = len(proposal.token_ids)
        parents = list(proposal.parents) if proposal.parents else list(range(-1, n - 1))
        sources = proposal.sources
        groups = [GRAPH] * n
        if len(sources) == n:
            groups = [_GROUP_OF_SOURCE.get(s, GRAPH) for s in sources]
        probs = proposal.path_probs
        if len(probs) != n:
            return cls(parents, groups, [confidence_bin(0.5)] * n)
        bins = []
        for prob, parent in zip(probs, parents, strict=True):
            above = probs[parent] if parent >= 0 else 1.0
            bins.append(bisect.bisect_right(BIN_EDGES, prob / above if above > 0 else 0.0))
        return cls(parents, groups, bins)


class SharedAcceptance:
    """The acceptance estimates every request of a coordinator starts from (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tried = [[0.0] * BINS for _ in GROUP_PRIOR]
        self._accepted = [[0.0] * BINS for _ in GROUP_PRIOR]
        self._rates = [[0.0] * BINS for _ in GROUP_PRIOR]
        for group in range(len(GROUP_PRIOR)):
            for b in range(BINS):
                self._refresh(group, b)

    def rate(self, group: int, b: int) -> float:
        return self._rates[group][b]

    def add(self, counts: Counts) -> None:
        """Add {(group, bin): [tried, accepted]} observations."""
        with self._lock:
            for (group, b), (tried, accepted) in counts.items():
                self._tried[group][b] += tried
                self._accepted[group][b] += accepted
                if self._tried[group][b] > COUNT_CAP:
                    self._tried[group][b] /= 2
                    self._accepted[group][b] /= 2
                self._refresh(group, b)

    def _refresh(self, group: int, b: int) -> None:
        prior = MID_CONFIDENCE[b] * GROUP_PRIOR[group]
        value = (self._accepted[group][b] + PRIOR_WEIGHT * prior) / (
            self._tried[group][b] + PRIOR_WEIGHT
        )
        self._rates[group][b] = min(MAX_RATE, value)

    def snapshot(self) -> dict[str, list[list[float]]]:
        """Counts and rates by group and bin (for logs and tests)."""
        with self._lock:
            return {
                "tried": [list(r) for r in self._tried],
                "accepted": [list(r) for r in self._accepted],
                "rate": [list(r) for r in self._rates],
            }


class RequestAcceptance:
    """One request's acceptance estimates: its own counts over the shared ones."""

    def __init__(self, shared: SharedAcceptance) -> None:
        self.shared = shared
        self._tried = [[0] * BINS for _ in GROUP_PRIOR]
        self._accepted = [[0] * BINS for _ in GROUP_PRIOR]
        self._rates: dict[tuple[int, int], float] = {}  # by (group, bin), as last computed
        self._unshared: Counts = {}  # counts not handed to the shared estimate yet
        self._adds = 0

    def rate(self, group: int, b: int) -> float:
        tried = self._tried[group][b]
        shared = self.shared.rate(group, b)
        if not tried:
            return shared
        value = (self._accepted[group][b] + REQUEST_WEIGHT * shared) / (tried + REQUEST_WEIGHT)
        return min(MAX_RATE, value)

    def add(self, counts: Counts) -> None:
        """Add {(group, bin): [tried, accepted]} observations here, and to the shared counts
        every SHARE_EVERY calls."""
        rates, unshared = self._rates, self._unshared
        for cell, (tried, accepted) in counts.items():
            group, b = cell
            self._tried[group][b] += tried
            self._accepted[group][b] += accepted
            rates.pop(cell, None)
            pending = unshared.setdefault(cell, [0, 0])
            pending[0] += tried
            pending[1] += accepted
        self._adds += 1
        if self._adds % SHARE_EVERY == 0:
            self.share()

    def share(self) -> None:
        """Hand the counts added since the last hand-over to the shared estimate."""
        if self._unshared:
            self.shared.add(self._unshared)
            self._unshared = {}
        self._rates = {}  # the shared rates moved (other requests' counts too)

    def survival(self, nodes: NodeFeatures) -> list[float]:
        """Each node's survival (see the module docstring), in the draft's order."""
        rates = self._rates  # the rates of the cells drafts used (a few of the table's)
        out: list[float] = []
        for parent, group, b in zip(nodes.parents, nodes.groups, nodes.bins, strict=True):
            rate = rates.get((group, b))
            if rate is None:
                rate = rates[group, b] = self.rate(group, b)
            out.append((out[parent] if parent >= 0 else 1.0) * rate)
        return out


@dataclass
class _Pending:
    """A draft awaiting its outcome: it continued the context at position `start`; `node` is
    the deepest node on the path the output took so far (-1: none yet), `depth` how many output
    tokens after start have been checked."""

    start: int
    children: dict[int, list[int]]
    tokens: list[int]
    nodes: NodeFeatures
    node: int = -1
    depth: int = 0


@dataclass
class PendingDrafts:
    """Drafts of one request whose nodes are resolved against the output as it grows."""

    acceptance: RequestAcceptance
    _pending: list[_Pending] = field(default_factory=list)

    def add(self, proposal: DraftProposal, start: int, nodes: NodeFeatures) -> None:
        """A draft (all of it, cut or not) that continued the context at position start."""
        if not proposal.token_ids:
            return
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(nodes.parents):
            children.setdefault(parent, []).append(i)
        self._pending.append(_Pending(start, children, list(proposal.token_ids), nodes))
        del self._pending[:-MAX_PENDING]

    def resolve(self, context: Sequence[int]) -> None:
        """Check every pending draft against the context (prompt and output) so far: each node
        whose parent the output reached is tried, and accepted where its token was emitted."""
        still = []
        counts: Counts = {}
        for draft in self._pending:
            open_ = True
            groups, bins = draft.nodes.groups, draft.nodes.bins
            while draft.start + draft.depth < len(context):
                emitted = context[draft.start + draft.depth]
                following = -1
                for child in draft.children.get(draft.node, ()):
                    cell = counts.setdefault((groups[child], bins[child]), [0, 0])
                    cell[0] += 1
                    if draft.tokens[child] == emitted:
                        cell[1] += 1
                        following = child
                if following < 0 or following not in draft.children:
                    open_ = False  # the output left the draft (or passed its last node)
                    break
                draft.node, draft.depth = following, draft.depth + 1
            if open_:
                still.append(draft)
        self._pending = still
        if counts:
            self.acceptance.add(counts)
