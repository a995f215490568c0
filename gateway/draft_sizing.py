"""Cost-aware draft sizes: how much to draft, and how much of it to verify, round by round.

A draft token pays only when the chance that it is accepted is worth what it costs to draft and
to verify. Each round of a request (gateway.coordinator) asks its :class:`RequestSizer`:

1. **plan** (before drafting): whether to draft at all, how many nodes (a tree's node budget, or
   a chain's length) and whether to use the context overlay;
2. **cut** (after drafting): which best-first prefix of the draft to verify. With s_i the
   survival of the i-th likeliest node (gateway.acceptance: the drafter's confidence, calibrated
   against what the target emitted), the verifier emits 1 + s_1 + ... + s_n tokens in expectation
   when n nodes are verified, in T + V(n) seconds, where V(n) is the Verify call over the
   pending token and n drafts (the cost profile's forward over n + 1 tokens,
   speculant.cost_profile, plus the call's measured overhead) and T this round's drafting time
   plus the coordinator's own time per round. The cut takes the n (0 included: a plain decoding
   step) that maximises expected tokens per second, (1 + s_1 + ... + s_n) / (T + V(n));
3. **observe** (after verifying): the round's timings and outcome, which refresh the Verify
   call's overhead, the drafting cost per node, the calibration and the next round's budget.

The next budget is the draft size that would have paid best this round if verified whole: the
N maximising (1 + s_1 + ... + s_N) / (T' + d N + V(N)), with d the drafter's own seconds per
node (measured by the drafter, without the RPC) and T' the coordinator's time plus the draft
call's overhead (N = 0: no draft call at all). The next round drafts 1.5 N + 2 nodes (twice
the budget instead when all of a full-budget draft paid), within the request's limits (``k``
deep, ``tree_nodes`` nodes, or a chain of ``k``). Where no draft paid twice in a row a request
stops drafting for 1, 2, 4 ... up to MAX_SKIP rounds between probes, unless drafting costs less
than SKIP_FRACTION of a plain step (then it drafts every round, a cheap look-out for text the
drafts know): where drafts do not pay, it decodes plainly.

Exactness: sizing applies to point-mass (greedy) drafts, the default. They are verified by
sample-and-match, so any choice of verified nodes leaves the output a plain draw from p, and a
seeded request gives the same tokens whatever was drafted. Sampled drafts keep their fixed size
(the coordinator does not size them): a cut that looks at a drawn token's q would change the
distribution the verifier corrects against, and their output for a seed depends on the draft,
which must then not depend on timings.

The draft's *shape* is measured too: a tree (when the request's tree_nodes allow one) or a
chain (a tree one node wide: cheaper to draft and to verify), with or without the context
overlay (when overlay_weight > 0). Each round drafts the shape whose drafting rounds have
emitted the most tokens per second (shared by the coordinator's requests; each shape is tried
MIN_SAMPLES rounds first, and every EXPLORE_EVERY-th round of a request tries another, so all
stay measured): where the overlay or a tree does not pay its drafting time, it is not used.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import NamedTuple

from gateway.acceptance import NodeFeatures, PendingDrafts, RequestAcceptance, SharedAcceptance
from speculant.cost_profile import CostProfile
from speculant.types import DraftParams, DraftProposal, VerifyResult

MAX_SKIP = 16  # rounds without drafting between two probes, at most
QUIET_ROUNDS = 8  # rounds in a row where no draft paid before a request stops drafting
SKIP_FRACTION = 0.02  # drafting cheaper than this share of a plain step never stops
FIRST_BUDGET = 12  # nodes the first round of the first request drafts (then: learned)
GROW = 1.5  # next budget = GROW * (the size that paid best) + MARGIN
MARGIN = 2
EXPLORE_EVERY = 16  # every so many rounds a request drafts the other way (overlay on / off)
EMA = 0.1  # weight of one round in the moving averages
SHAPE_EMA = 0.02  # the same in the shapes' tokens and seconds per round (they are noisy)
MIN_SAMPLES = 8  # rounds each shape drafts before the choice follows the measurements


class Shape(NamedTuple):
    """How a round drafts: a tree (else a chain), with the context overlay (else without)."""

    tree: bool
    overlay: bool


class _Average:
    """An exponential moving average that starts at its first sample."""

    __slots__ = ("samples", "value")

    def __init__(self, value: float = 0.0) -> None:
        self.value = value
        self.samples = 0

    def add(self, sample: float, weight: float = EMA) -> None:
        self.value = sample if not self.samples else self.value + weight * (sample - self.value)
        self.samples += 1


class SizingModel:
    """What the rounds of every request of one coordinator learn together: the verify cost
    profile (refreshed from the coordinator's own Verify timings when it is a measured one), the
    acceptance calibration, the drafting cost per node with and without the overlay, the
    overlay's gain and the first round's budget (thread-safe enough: each update is a few float
    assignments under the GIL, and a lost update only delays learning)."""

    def verify_seconds(self, drafts: int) -> float:
        """V(drafts): the expected seconds of a Verify call with this many draft tokens."""
        return self.profile.cost(drafts + 1) + self.verify_overhead.value

    def verify_table(self, drafts: int) -> list[float]:
        """[V(0), ..., V(drafts)]."""
        overhead = self.verify_overhead.value
        return [cost + overhead for cost in self.profile.costs(drafts + 1)]

    def __init__(self, profile: CostProfile) -> None:
        self.profile = profile
        self.acceptance = SharedAcceptance()
        self.other_seconds = _Average()  # the coordinator's own time per round
        # what a Verify call costs beyond the profile's forward (sampling, the RPC)
        self.verify_overhead = _Average()
        # by draft shape: the drafter's own seconds per drafted node, and the tokens emitted
        # and seconds taken per drafting round; what a draft call costs beyond the drafter's
        # own time (the RPC)
        self.node_seconds: dict[Shape, _Average] = defaultdict(_Average)
        self.round_tokens: dict[Shape, _Average] = defaultdict(_Average)
        self.round_seconds: dict[Shape, _Average] = defaultdict(_Average)
        self.call_overhead = _Average()
        self.first_budget = _Average(FIRST_BUDGET)
        self._lock = threading.Lock()

    def for_request(self, params: DraftParams) -> RequestSizer:
        return RequestSizer(self, params)


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
        trees = (True, False) if params.drafts_tree else (False,)
        overlays = (True, False) if params.overlay_weight > 0 else (False,)
        self.shapes: list[Shape] = [Shape(t, o) for t in trees for o in overlays]
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
        key = (max(1, min(depth, params.k, nodes)), nodes, shape)
        planned = self._planned.get(key)
        if planned is None:  # a few per request: made once each
            changes: dict[str, object] = {"k": key[0]}
            if params.drafts_tree:
                changes["tree_nodes"] = nodes if shape.tree else 0
            if params.overlay_weight > 0 and not shape.overlay:
                changes["overlay_weight"] = 0.0
            planned = self._planned[key] = replace(params, **changes)
        return planned

    def _choose_shape(self) -> Shape:
        """The draft shape whose drafting rounds have emitted the most tokens per second (each
        measured MIN_SAMPLES rounds first, in turn; then every EXPLORE_EVERY-th round of a
        request tries the least measured other one, so all stay measured)."""
        if len(self.shapes) == 1:
            return self.shapes[0]
        tokens, seconds = self.model.round_tokens, self.model.round_seconds
        least = min(self.shapes, key=lambda s: tokens[s].samples)
        if tokens[least].samples < MIN_SAMPLES:
            return least
        best = max(self.shapes, key=lambda s: tokens[s].value / max(seconds[s].value, 1e-9))
        if self.rounds % EXPLORE_EVERY:
            return best
        others = [s for s in self.shapes if s != best]
        return min(others, key=lambda s: tokens[s].samples)

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
        order = sorted(range(len(survival)), key=lambda i: (-survival[i], i))
        verify = self.model.verify_table(len(order))
        fixed = draft_seconds + self.model.other_seconds.value
        best_n, best = 0, 1.0 / (fixed + verify[0])
        expected = 1.0
        for n, index in enumerate(order, start=1):
            expected += survival[index]
            rate = expected / (fixed + verify[n])
            if rate > best:
                best_n, best = n, rate
        self.rate = best
        return Cut(sorted(order[:best_n]), best, [survival[i] for i in order], nodes)

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
        draft_s, verify_s, round_s = seconds
        model = self.model
        forward = model.profile.cost(len(verified.token_ids) + 1)  # what the profile expects
        model.verify_overhead.add(max(0.0, verify_s - forward))
        model.other_seconds.add(max(0.0, round_s - draft_s - verify_s))
        if drafted is not None:
            nodes = self.last_cut.nodes or NodeFeatures.of(drafted)
            self.pending.add(drafted, start, nodes)
            size = len(drafted.token_ids)
            own = drafted.seconds if 0 < drafted.seconds <= draft_s else draft_s
            model.node_seconds[self.shape].add(own / max(1, size))
            model.call_overhead.add(draft_s - own)
            if len(self.shapes) > 1:
                model.round_tokens[self.shape].add(result.accepted_count + 1.0, SHAPE_EMA)
                model.round_seconds[self.shape].add(round_s, SHAPE_EMA)
            paying = self._best_budget(self.last_cut.ranked)
            self._next_budget(size, paying)
            self._maybe_skip(paying, draft_s)
        self.pending.resolve(context)

    def _best_budget(self, ranked: list[float]) -> int:
        """The draft size that would have paid best this round, verified whole: the N
        maximising (1 + s_1 + ... + s_N) / (T + d N + V(N)) over N = 0 .. the nodes drafted,
        with s_i the ranked survivals, d the drafter's seconds per node, V the verify call and
        T the rest of a round (N = 0: no draft call at all)."""
        model = self.model
        verify, other = model.verify_table(len(ranked)), model.other_seconds.value
        per_node = model.node_seconds[self.shape].value
        fixed = other + model.call_overhead.value
        best_n, best = 0, 1.0 / (other + verify[0])
        expected = 1.0
        for n, survival in enumerate(ranked, start=1):
            expected += survival
            rate = expected / (fixed + per_node * n + verify[n])
            if rate > best:
                best_n, best = n, rate
        return best_n

    def _next_budget(self, drafted: int, paying: int) -> None:
        """Grow the budget when all of a full-budget draft paid, else set it to what paid, with
        room to find better nodes."""
        if paying >= drafted >= self.budget:
            self.budget = min(self.limit, 2 * self.budget)
        else:
            self.budget = max(1, min(self.limit, math.ceil(GROW * paying) + MARGIN))

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
        """The request ended: its last budget joins the first-round budget of later ones."""
        with self.model._lock:
            self.model.first_budget.add(float(self.budget))
