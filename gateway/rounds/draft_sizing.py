"""Cost-aware draft sizes: how much to draft, and how much of it to verify, round by round.

A draft token pays only when the chance that it is accepted is worth what it costs to draft and
to verify. Each round of a request (gateway.rounds.coordinator) asks its :class:`RequestSizer`:

1. **plan** (before drafting): whether to draft at all, how many nodes (a tree's node budget, or
   a chain's length) and whether to use the context overlay;
2. **cut** (after drafting): which best-first prefix of the draft to verify. With s_i the
   survival of the i-th likeliest node (the drafter's confidence, calibrated against what the
   target emitted: *calibrated acceptance* below), the verifier emits 1 + s_1 + ... + s_n
   tokens in expectation when n nodes are verified, in T + V(n) seconds, where V(n) is the
   Verify call over the pending token and n drafts (the cost profile's forward over n + 1 tokens,
   speculant.cost_profile, plus the call's measured overhead) and T this round's drafting time
   plus the coordinator's own time per round. The cut takes the n (0 included: a plain decoding
   step) that maximises expected tokens per second, (1 + s_1 + ... + s_n) / (T + V(n)); where
   the verifier batches this request's steps with others', each token beyond the first costs
   once more for every other row of the forward (SizingModel.forward_costs);
3. **observe** (after verifying): the round's timings and outcome, which refresh the Verify
   call's overhead, the drafting cost, the calibration and the next round's budget.

A request starts from what the coordinator's earlier requests of its graph learned (the
SizingModel): the calibration, the drafting costs, the shapes' rates, and its first round's
budget, the average budget of the coordinator's drafting rounds (a request's *last* budget would
say little: the end of an answer cuts the last drafts short).

The next budget is the draft size that would have paid best this round if verified whole: the
N maximising (1 + s_1 + ... + s_N) / (T' + a + b N + V(N)), with a + b N the drafter's own
seconds for N nodes (measured by the drafter, without the RPC: a per call, b per node, fitted
over rounds of varied sizes) and T' the coordinator's time plus the draft call's overhead
(N = 0: no draft call at all). The next round drafts GROW N nodes and room to find better
ones: MARGIN, or as many as the drafter makes in ROOM_SHARE of a plain decoding step if that is
more (by its mean seconds per node: a few dozen nodes on a CPU, where a forward costs a few
thousand nodes' drafting; the cut then verifies the few of them that pay). It drafts twice the
budget instead when all of a full-budget draft paid; always within the request's limits (``k``
deep, ``tree_nodes`` nodes, or a chain of ``k``). Where no draft paid for QUIET_ROUNDS rounds
in a row a request stops drafting for 1, 2, 4 ... up to MAX_SKIP rounds between probes, unless
drafting costs less than SKIP_FRACTION of a plain step (then it drafts every round, a cheap
look-out for text the drafts know): where drafts do not pay, it decodes plainly.

Exactness: sizing applies to point-mass (greedy) drafts, the default. They are verified by
sample-and-match, so any choice of verified nodes leaves the output a plain draw from p, and a
seeded request gives the same tokens whatever was drafted. Sampled drafts keep their fixed size
(the coordinator does not size them): a cut that looks at a drawn token's q would change the
distribution the verifier corrects against, and their output for a seed depends on the draft,
which must then not depend on timings.

The draft's *shape* is measured too: the richest the request allows (a tree when its
tree_nodes allow one, with the context overlay when overlay_weight > 0) against the cheapest, a
chain without the overlay (a tree one node wide: cheaper to draft and to verify). Each round
drafts the shape whose drafting rounds have emitted the most tokens per second, the richest
unless another's rate is more than RICH_MARGIN higher (a round's
seconds as the cost profile prices its Verify call: measured, they are the host's; flat, a
GPU's, where a tree costs what a chain does; shared by the coordinator's requests of one
graph; each shape is tried MIN_SAMPLES rounds first; then the other is tried
again every EXPLORE_EVERY / f^2 rounds, MAX_EXPLORE_EVERY at most, where f is its rate as a
fraction of the best's, so both stay measured and a poor shape's trials cost little): where
drafting a tree with the overlay does not pay (a tiny model on a CPU, whose forward costs about
what drafting does), requests draft chains. The coordinator's first drafting round (a
FIRST_BUDGET probe) is not counted in the rates, and drafting seconds past STALL_STEPS plain
steps (a compile, a stall) count as STALL_STEPS plain steps everywhere. The mixed shapes (a
tree without the overlay, a chain with it) are not tried: where the richest shape loses to the
cheapest they rarely win, and each shape compared costs its trials and the noise of its estimate
(measured against four shapes in docs/benchmarks.md).

**Calibrated acceptance** (how likely the target is to accept each draft token, learned online).

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

Why so long: sizing is one model, what a draft node costs (the cost profile, the drafting
costs) against how likely it is to survive (the calibrated acceptance); the calibration is
the sizer's own half of it, learned from the rounds it sizes, and no one else reads it.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from speculant.config import DraftParams
from speculant.cost_profile import CostProfile
from speculant.types import DraftProposal, VerifyResult

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


MAX_SKIP = 16  # rounds without drafting between two probes, at most
QUIET_ROUNDS = 8  # rounds in a row where no draft paid before a request stops drafting
SKIP_FRACTION = 0.02  # drafting cheaper than this share of a plain step never stops
FIRST_BUDGET = 12  # nodes the first round of the first request drafts (then: learned)
BUDGET_EMA = 0.02  # weight of one drafting round in the budget a new request starts from
RICH_MARGIN = 0.1  # the cheapest shape replaces the richest when its rate is this much higher
STALL_STEPS = 4.0  # drafting seconds past this many plain steps are a stall (counted as this)
GROW = 1.5  # next budget = GROW * (the size that paid best) + MARGIN
MARGIN = 2
ROOM_SHARE = 0.01  # of a plain step: the drafting seconds of the room beyond what paid
EXPLORE_EVERY = 16  # rounds between two tries of another shape as good as the best, ...
MAX_EXPLORE_EVERY = 256  # ... and of one however much worse it measures
EMA = 0.1  # weight of one round in the moving averages
SHAPE_EMA = 0.02  # the same in the shapes' tokens and seconds per round (they are noisy)
MIN_SAMPLES = 8  # rounds each shape drafts before the choice follows the measurements
PLANNED_KEPT = 4096  # planned draft parameters a coordinator keeps
MIN_SIZE_VARIANCE = 1.0  # draft sizes must vary this much (nodes squared) to split their cost


class Shape(NamedTuple):
    """How a round drafts: a tree (else a chain), with the context overlay (else without)."""

    tree: bool
    overlay: bool


CHAIN = Shape(tree=False, overlay=False)  # the cheapest shape


class _Average:
    """An exponential moving average that is the plain mean of its first 1 / weight samples
    (so no one early sample, a cold start's, weighs more than the others)."""

    __slots__ = ("samples", "value")

    def __init__(self, value: float = 0.0) -> None:
        self.value = value
        self.samples = 0

    def add(self, sample: float, weight: float = EMA) -> None:
        self.samples += 1
        self.value += max(weight, 1.0 / self.samples) * (sample - self.value)


class _DraftCost:
    """The drafter's own seconds for a draft of n nodes, a + b n: a the work of a call whatever
    its size (reading the context, the first steps), b that of one more node. Fitted by
    exponentially weighted least squares over rounds (each round one weight EMA); while the
    sizes seen barely vary the two cannot be told apart and the model is the mean seconds per
    node times n (no fixed part: the cautious split, which makes big drafts look dearest). Each
    round weighs EMA, except that the first 1 / EMA rounds are a plain mean."""

    __slots__ = ("mean_n", "mean_nn", "mean_nt", "mean_t", "samples")

    def __init__(self) -> None:
        self.mean_n = self.mean_t = self.mean_nn = self.mean_nt = 0.0
        self.samples = 0

    def add(self, nodes: int, seconds: float, weight: float = EMA) -> None:
        self.samples += 1
        w = max(weight, 1.0 / self.samples)  # the plain mean of the first 1 / weight rounds
        self.mean_n += w * (nodes - self.mean_n)
        self.mean_t += w * (seconds - self.mean_t)
        self.mean_nn += w * (nodes * nodes - self.mean_nn)
        self.mean_nt += w * (nodes * seconds - self.mean_nt)

    def split(self) -> tuple[float, float]:
        """(a, b): seconds per call, seconds per node."""
        if self.mean_n <= 0:
            return 0.0, 0.0
        per_node = self.mean_t / self.mean_n
        variance = self.mean_nn - self.mean_n**2
        if variance < MIN_SIZE_VARIANCE:
            return 0.0, per_node
        slope = (self.mean_nt - self.mean_n * self.mean_t) / variance
        slope = min(max(slope, 0.0), per_node)  # a >= 0, b >= 0
        return self.mean_t - slope * self.mean_n, slope


class SizingModel:
    """What the rounds of every request of one coordinator learn together: the verify cost
    profile (refreshed from the coordinator's own Verify timings when it is a measured one), the
    acceptance calibration, each draft shape's drafting cost (per call and per node) and its
    tokens and seconds per round, and the first round's budget (thread-safe enough: each
    update is a few float assignments under the GIL, and a lost update only delays learning)."""

    def verify_seconds(self, drafts: int) -> float:
        """V(drafts): the expected seconds of a Verify call with this many draft tokens."""
        return self.profile.cost(drafts + 1) + self.verify_overhead.value

    def forward_costs(self, drafts: int) -> list[float]:
        """What verifying n = 0..drafts draft tokens costs a round: the profile's forward over
        n + 1 tokens, and where the verifier batches this request's steps with others' (on
        average batch_rows rows a forward), each token beyond the first once more for every
        other row, which its place in the batched forward delays as much as this one. So a
        draft is sized by its marginal cost in the batch: at high concurrency on hardware whose
        forward grows with its tokens, drafts shrink instead of slowing every stream; with a
        flat profile (a GPU below saturation) nothing changes. The rate a cut maximises stays
        this request's (its round's time, the batch's wait included through the Verify
        overhead); the batch's aggregate rate is about it times the rows."""
        forward = self.profile.costs(drafts + 1)
        others = self.batch_rows.value - 1.0
        if others <= 0.0:
            return forward
        base = forward[0]
        return [cost + others * (cost - base) for cost in forward]

    def __init__(self, profile: CostProfile) -> None:
        # a measured profile that is not refreshed is a snapshot (the services' GetModelInfo at
        # connection): refreshed here from the forward seconds each Verify reports, as the
        # verifier refreshes its own (which the embedded mode shares)
        self.refreshes = profile.source == "measured" and not profile.refresh
        self.profile = profile.copy(refresh=True) if self.refreshes else profile
        self.acceptance = SharedAcceptance()
        self.other_seconds = _Average()  # the coordinator's own time per round
        # what a Verify call costs beyond the profile's forward (sampling, the RPC, a batch's
        # other rows)
        self.verify_overhead = _Average()
        self.batch_rows = _Average(1.0)  # rows of the forwards that verified the drafts
        # by draft shape: the drafter's own seconds by drafted nodes, and the tokens emitted
        # and seconds taken per drafting round; what a draft call costs beyond the drafter's
        # own time (the RPC)
        self.draft_cost: dict[Shape, _DraftCost] = defaultdict(_DraftCost)
        self.round_tokens: dict[Shape, _Average] = defaultdict(_Average)
        self.round_seconds: dict[Shape, _Average] = defaultdict(_Average)
        self.call_overhead = _Average()
        self.shape_rounds = 0  # drafting rounds, and the last one of each shape
        self.last_tried: dict[Shape, int] = defaultdict(int)
        # the budget a new request's first round drafts: the budgets of the coordinator's
        # drafting rounds, averaged (every round, not a request's last budget, which the end of
        # an answer cuts short)
        self.first_budget = _Average(FIRST_BUDGET)
        self._planned: dict[tuple[DraftParams, int, int, Shape], DraftParams] = {}

    def for_request(self, params: DraftParams) -> RequestSizer:
        return RequestSizer(self, params)

    def planned(self, params: DraftParams, k: int, nodes: int, shape: Shape) -> DraftParams:
        """params drafting `shape`, k deep and `nodes` nodes at most (kept: requests of the
        same parameters plan the same few; at most PLANNED_KEPT)."""
        key = (params, k, nodes, shape)
        planned = self._planned.get(key)
        if planned is None:
            changes: dict[str, object] = {"k": k}
            if params.drafts_tree:
                changes["tree_nodes"] = nodes if shape.tree else 0
            if params.overlay_weight > 0 and not shape.overlay:
                changes["overlay_weight"] = 0.0
            planned = replace(params, **changes)
            if len(self._planned) >= PLANNED_KEPT:
                self._planned.clear()
            self._planned[key] = planned
        return planned


@dataclass
class Cut:
    """What a cut decided: the nodes kept (indices into the draft, ascending), the rate it
    expects (tokens per second), every node's survival, likeliest first, and the draft's
    features (for calibration once the output is known)."""

    keep: list[int]
    rate: float
    ranked: list[float]
    nodes: NodeFeatures | None = None


class RequestSizer:
    """The sizing of one request's rounds (see the module docstring)."""

    def __init__(self, model: SizingModel, params: DraftParams) -> None:
        self.model = model
        self.limit = params.tree_nodes if params.drafts_tree else params.k
        self.budget = max(1, min(self.limit, round(model.first_budget.value)))
        self.acceptance = RequestAcceptance(model.acceptance)
        self.pending = PendingDrafts(self.acceptance)
        # the richest shape the request allows and the cheapest (see the module docstring)
        richest, cheapest = Shape(params.drafts_tree, params.overlay_weight > 0), CHAIN
        self.shapes: list[Shape] = [richest] if richest == cheapest else [richest, cheapest]
        self.shape = self.shapes[0]  # this round's
        self.rounds = 0
        self.quiet = 0  # rounds in a row where no draft paid
        self.skip = 0  # rounds left without drafting
        self.rate = 0.0  # tokens per second the last cut expected
        self._planned: dict[tuple[int, int, Shape], DraftParams] = {}
        self.last_cut = Cut([], 0.0, [])

    # -- before drafting ----------------------------------------------------------------------

    def plan(self, params: DraftParams, depth: int) -> DraftParams | None:
        """This round's draft parameters (its shape, a node budget, a depth of at most
        `depth`), or None: no draft this round."""
        self.rounds += 1
        if depth <= 0:
            return None
        if self.skip > 0:
            self.skip -= 1
            return None
        nodes = min(self.limit, self.budget)
        self.shape = shape = self._choose_shape()
        self.model.shape_rounds += 1
        self.model.last_tried[shape] = self.model.shape_rounds
        key = (max(1, min(depth, params.k, nodes)), nodes, shape)
        planned = self._planned.get(key)
        if planned is None:  # a few per request: the model's, made once for all requests
            planned = self._planned[key] = self.model.planned(params, *key)
        return planned

    def _choose_shape(self) -> Shape:
        """The draft shape whose drafting rounds have emitted the most tokens per second (each
        measured MIN_SAMPLES rounds first, in turn; the richest unless another's rate exceeds
        its by more than RICH_MARGIN, about the noise of the rates: on chat answers the
        richest one's overlay drafts what the prompt repeats, and a few rounds of an early,
        unlike request must not turn the coordinator to chains). The others stay measured:
        one whose rate is a fraction f of the best is tried again once EXPLORE_EVERY / f^2
        drafting rounds of the coordinator (MAX_EXPLORE_EVERY at most) have passed since its
        last try, so the worse a shape measures, the less its trials cost."""
        if len(self.shapes) == 1:
            return self.shapes[0]
        model = self.model
        tokens, seconds = model.round_tokens, model.round_seconds
        least = min(self.shapes, key=lambda s: tokens[s].samples)
        if tokens[least].samples < MIN_SAMPLES:
            return least
        rates = {s: tokens[s].value / max(seconds[s].value, 1e-9) for s in self.shapes}
        best = max(self.shapes, key=rates.__getitem__)
        richest = self.shapes[0]
        if rates[best] <= (1 + RICH_MARGIN) * rates[richest]:
            best = richest  # within the rates' noise: the richest drafts what the context repeats
        now = model.shape_rounds
        for shape in sorted(self.shapes, key=lambda s: model.last_tried[s]):  # longest untried
            if shape == best:
                continue
            share = max(rates[shape] / max(rates[best], 1e-9), 1e-3) ** 2
            if now - model.last_tried[shape] >= min(MAX_EXPLORE_EVERY, EXPLORE_EVERY / share):
                return shape
        return best

    # -- after drafting -----------------------------------------------------------------------

    def cut(self, proposal: DraftProposal, draft_seconds: float) -> DraftProposal:
        """The part of the (point-mass) draft to verify."""
        if not proposal.token_ids:
            self.last_cut = Cut([], 0.0, [])
            return proposal
        decision = self.decide(proposal, draft_seconds)
        self.last_cut = decision
        if len(decision.keep) == len(proposal.token_ids):
            return proposal
        return proposal.select(decision.keep)

    def decide(self, proposal: DraftProposal, draft_seconds: float) -> Cut:
        """The best-first prefix maximising expected tokens per second (see the module
        docstring)."""
        nodes = NodeFeatures.of(proposal)
        survival = self.acceptance.survival(nodes)
        # likeliest first, ties by position (a stable sort keeps them in order)
        order = sorted(range(len(survival)), key=survival.__getitem__, reverse=True)
        model = self.model
        forward = model.forward_costs(len(order))  # V(n) = forward[n] + the call's overhead
        fixed = draft_seconds + model.other_seconds.value + model.verify_overhead.value
        best_n, best = 0, 1.0 / (fixed + forward[0])
        expected = 1.0
        ranked = []
        for n, index in enumerate(order, start=1):
            node = survival[index]
            if nodes.groups[index] != GRAMMAR:  # the drafter's nodes (what a budget buys)
                ranked.append(node)
            expected += node
            rate = expected / (fixed + forward[n])
            if rate > best:
                best_n, best = n, rate
        self.rate = best
        return Cut(sorted(order[:best_n]), best, ranked, nodes)

    # -- after verifying ----------------------------------------------------------------------

    def observe(
        self,
        drafted: DraftProposal | None,
        verified: DraftProposal,
        result: VerifyResult,
        start: int,
        context: list[int],
        seconds: tuple[float, float, float],
    ) -> None:
        """Learn from a finished round: `drafted` the whole draft (None: no draft this round),
        `verified` what was verified, `start` the context length the draft continued,
        `context` the prompt and output after the round, seconds = (draft, verify, whole
        round)."""
        model = self.model
        draft_s, verify_s, round_s = self._without_stall(seconds)
        forward = model.profile.cost(len(verified.token_ids) + 1)  # what the profile expects
        model.batch_rows.add(float(max(1, result.batch_rows)))
        if model.refreshes and result.seconds > 0 and result.batch_rows <= 1:
            # (a batch's seconds are its rows' together, not what this one costs alone)
            model.profile.observe(len(verified.token_ids) + 1, result.seconds)
        model.verify_overhead.add(max(0.0, verify_s - forward))
        model.other_seconds.add(max(0.0, round_s - draft_s - verify_s))
        if drafted is not None:
            nodes = self.last_cut.nodes or NodeFeatures.of(drafted)
            self.pending.add(drafted, start, nodes)
            size = len(drafted.token_ids) - nodes.groups.count(GRAMMAR)  # the drafter's nodes
            own = drafted.seconds if 0 < drafted.seconds <= draft_s else draft_s
            model.draft_cost[self.shape].add(size, own)
            model.call_overhead.add(draft_s - own)
            if len(self.shapes) > 1 and model.shape_rounds > 1:
                # the round as the cost profile prices its Verify call: a flat profile (a GPU's)
                # compares shapes by what they would cost there, not by this host's forwards;
                # not the coordinator's first drafting round (FIRST_BUDGET nodes of the richest
                # shape, the drafter's first call: a probe, unlike the rounds that follow)
                priced = round_s - verify_s + forward + model.verify_overhead.value
                model.round_tokens[self.shape].add(result.accepted_count + 1.0, SHAPE_EMA)
                model.round_seconds[self.shape].add(priced, SHAPE_EMA)
            paying = self._best_budget(self.last_cut.ranked)
            self._next_budget(size, paying)
            model.first_budget.add(float(self.budget), BUDGET_EMA)
            self._maybe_skip(paying, draft_s)
        self.pending.resolve(context)

    def _without_stall(self, seconds: tuple[float, float, float]) -> tuple[float, ...]:
        """(draft, verify, round) seconds with the drafting part cut to STALL_STEPS plain steps:
        drafting that took longer was a stall (a compile on first use, the host busy
        elsewhere), not what drafting costs, and one such round would otherwise weigh on the
        shared drafting costs and shape rates for hundreds of rounds."""
        draft_s, verify_s, round_s = seconds
        stall = STALL_STEPS * self.model.verify_seconds(0)
        excess = max(0.0, draft_s - stall)
        return draft_s - excess, verify_s, round_s - excess

    def _best_budget(self, ranked: list[float]) -> int:
        """The draft size that would have paid best this round, verified whole: the N
        maximising (1 + s_1 + ... + s_N) / (T + a + b N + V(N)) over N = 0 .. the nodes
        drafted, with s_i the ranked survivals, a + b N the drafter's own seconds for N nodes
        (_DraftCost), V the verify call and T the rest of a round with the draft call's
        overhead (N = 0: no draft call at all)."""
        model = self.model
        forward = model.forward_costs(len(ranked))  # V(n) = forward[n] + the overhead
        other = model.other_seconds.value + model.verify_overhead.value
        per_call, per_node = model.draft_cost[self.shape].split()
        fixed = other + model.call_overhead.value + per_call
        best_n, best = 0, 1.0 / (other + forward[0])
        expected = 1.0
        for n, survival in enumerate(ranked, start=1):
            expected += survival
            rate = expected / (fixed + per_node * n + forward[n])
            if rate > best:
                best_n, best = n, rate
        return best_n

    def _next_budget(self, drafted: int, paying: int) -> None:
        """Grow the budget when all of a full-budget draft paid, else set it to what paid, with
        room to find better nodes: MARGIN nodes, or as many as the drafter makes in ROOM_SHARE
        of a plain decoding step if that is more (the cut picks the best of them)."""
        if paying >= drafted >= self.budget:
            self.budget = min(self.limit, 2 * self.budget)
        else:
            self.budget = max(1, min(self.limit, math.ceil(GROW * paying) + self._room()))

    def _room(self) -> int:
        """Nodes drafted beyond the size that paid: MARGIN, or those the drafter makes in
        ROOM_SHARE of a plain step if more (by its mean seconds per node, its per-call part
        included: the cautious reading)."""
        cost = self.model.draft_cost[self.shape]
        if cost.mean_n <= 0 or cost.mean_t <= 0:
            return MARGIN
        per_node = cost.mean_t / cost.mean_n
        return max(MARGIN, int(ROOM_SHARE * self.model.verify_seconds(0) / per_node))

    def _maybe_skip(self, paying: int, draft_seconds: float) -> None:
        """After rounds where no draft paid, stop drafting for a while, where drafting costs
        more than SKIP_FRACTION of a plain step (else a draft is a cheap look-out)."""
        if paying:
            self.quiet = 0
            return
        self.quiet += 1
        plain_step = self.model.verify_seconds(0)
        if self.quiet >= QUIET_ROUNDS and draft_seconds > SKIP_FRACTION * plain_step:
            self.skip = min(MAX_SKIP, 2 ** (self.quiet - QUIET_ROUNDS))

    def finish(self) -> None:
        """The request ended: its last acceptance counts join the shared ones."""
        self.acceptance.share()
