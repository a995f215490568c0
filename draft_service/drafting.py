"""The drafting core: draft tokens from an n-gram graph (a plain library, no gRPC).

Terms:
- *backoff*: at each draft position, look up the last n tokens of the context for
  n = max_order down to 1 (one LMDB get per order) and draft from the highest order that matches;
  after each drafted token the context grows by it and is matched again.
- *matched order*: the highest order whose context matched at a position.
- *dead end*: no order matches; drafting stops there and the draft is partial (possibly empty).
- *q*: the distribution the drafted token was drawn from. With attentive mixing (the default), the
  mix of every matching order's successor distribution under ``params.mixing`` (see
  :mod:`draft_service.mixing`); with ``mixing="backoff"`` or ``attentive_mix=False``, the
  successor distribution of the matched order alone. ``greedy`` drafts argmax q (ties: lowest
  token id), and the q it reports is then a point mass at that token, since that is the
  distribution it was drawn from; ``sampling`` draws from q with a numpy Generator and reports q.
- *running probability* of draft token d_i: q(d_1) * ... * q(d_i), with q the mixed distribution
  (for ``greedy`` the mass of argmax q before it is reported as a point mass): the drafter's own
  estimate that the draft survives to position i. With ``min_draft_prob`` > 0 the draft ends
  before position i (i >= 2) when q(d_1) * ... * q(d_{i-1}) * max q_i is below it (*adaptive
  length*): for ``greedy`` that is d_i's running probability; for ``sampling`` it is decided
  before d_i is drawn, so that d_i is a plain draw from the q it reports (exactness).
- *outcome* of verifying a draft d_1..d_k: the verifier accepts d_1..d_j, then emits one token t
  (a correction t != d_{j+1}, or the bonus token when j = k). ``next_round_drafts`` prepares the
  drafts of the likeliest outcomes while the verifier runs, so a gateway need not wait for a
  draft call after verification when the outcome is one of them.
- *draft tree*: with ``params.drafts_tree`` (tree_nodes > 0, no min_draft_prob)
  the draft is a tree of up to tree_nodes tokens, at most k deep, grown best-first by path
  probability q(t_1) * ... * q(t_d) under the mixed q. ``greedy``: each node offers its
  TREE_WIDTH likeliest successors (each q a point mass); the greedy chain is its first branch.
  ``sampling``: each node's children are TREE_WIDTH draws from its q *without replacement*
  (fewer where q has fewer tokens or the budget ends; how many is fixed before drawing), child
  i reporting q_i = q without the earlier children, renormalised: what the verifier's recursive
  rejection rule needs (verifier_service.rejection). The verifier checks every branch in one
  forward pass and keeps the path it accepts.
- *overlay*: with ``overlay_weight`` > 0 the whole context_ids (prompt + generated tokens) is a
  second source of n-grams; wherever it has successors for the tail, q is mixed from the combined
  counts c_graph,o + overlay_weight * c_context,o (:mod:`draft_service.overlay`), else from the
  graph alone as above. Each draft token's *source* ("graph", "overlay" or "both") says which
  sources listed it as a successor at the orders q was mixed from.
- *live layer*: with a :class:`~draft_service.live_layer.LiveLayer` (what the draft service
  learned from the generations it served), its counts join the graph's first: c_graph,o +
  live.weight * c_live,o, then the overlay's as above. Its tokens count as source "graph" (the
  draft tier's shared counts). Drafts change as the layer learns; outputs do not (drafts are
  only proposals).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import math
import struct
from collections.abc import Callable, Sequence

import lmdb
import numpy as np

from draft_service.live_layer import LiveLayer
from draft_service.mixing import Mixer
from draft_service.overlay import Combined, ContextIndex, ContextIndexCache, as_arrays, combine
from speculant.errors import InvalidArgumentError
from speculant.graph_reader import NGramGraph
from speculant.types import DraftParams, DraftProposal, NextRoundDraft, SparseDistribution

_U32 = np.dtype("<u4")
_BE32 = np.dtype(">u4")
_PACK_ONE = struct.Struct(">I").pack
_DEAD_END = (-1, 0, 0.0)
DEFAULT_CACHE_SIZE = 32768  # greedy steps kept (a few MB at most)
TREE_WIDTH = 3  # successors a tree node offers (3 beat 2 on the tinystories dev prompts)
# A tree step: (matched order, [(successor, q, source), ...] likeliest first), (0, []) at a dead end
_TreeStep = tuple[int, list[tuple[int, float, str]]]


class Drafter:
    """Proposes up to k draft tokens continuing a context, from one opened graph (thread-safe)."""

    def __init__(
        self,
        graph: NGramGraph,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        live: LiveLayer | None = None,
    ) -> None:
        """live: a live layer (what this service learned from generations it served) whose
        counts are combined with the graph's (see :mod:`draft_service.live_layer`)."""
        self.graph = graph
        self.live = live
        self.max_order = graph.max_order
        self.vocab_size = graph.vocab_size
        self._mixer = Mixer(graph.vocab_size)
        # Greedy steps depend only on the last max_order tokens and the mixing parameters, and
        # consecutive rounds of one generation revisit them: a bounded cache (FIFO eviction) of
        # (tail, mixing parameters) -> (token, matched order, q(token) or NaN), or _DEAD_END;
        # with the overlay, (tail, mixing parameters, overlay weight, the context's successor
        # counts for the tail) -> (token, matched order, q(token), source).
        self.cache_size = cache_size
        self._greedy_cache: dict[tuple, tuple[int, int, float]] = {}
        # Draft trees: (tail, mixing parameters[, overlay weight, overlay counts]) -> (matched
        # order, the TREE_WIDTH likeliest successors with their q and source), same bound.
        self._tree_cache: dict[tuple, _TreeStep] = {}
        # request params -> the same with unset mixing parameters filled from the graph's tuned
        # defaults (graph.draft_defaults) or the built-in ones; cleared at 1024 entries
        self._resolved: dict[DraftParams, DraftParams] = {}
        # the overlay's context indexes of recent requests (draft_service.overlay)
        self._overlays = ContextIndexCache(graph.max_order)

    def resolve(self, params: DraftParams) -> DraftParams:
        """params with every unset mixing parameter filled: the graph's tuned default where it
        has one, else the built-in default (explicit values win)."""
        resolved = self._resolved.get(params)
        if resolved is None:
            resolved = params.with_defaults(getattr(self.graph, "draft_defaults", None))
            if len(self._resolved) >= 1024:
                self._resolved.clear()
            self._resolved[params] = resolved
        return resolved

    def validate_context(self, context_ids: Sequence[int] | np.ndarray) -> None:
        """InvalidArgumentError naming ``context_token_ids`` unless every id is in [0, vocab)."""
        if len(context_ids) == 0:
            return
        if isinstance(context_ids, np.ndarray):
            if context_ids.dtype.kind not in "iu":
                raise InvalidArgumentError(
                    "context_token_ids", f"must be integers, got dtype {context_ids.dtype}"
                )
            low, high = int(context_ids.min()), int(context_ids.max())
        else:
            low, high = min(context_ids), max(context_ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InvalidArgumentError(
                "context_token_ids",
                f"token id {bad} is outside the graph's vocabulary [0, {self.vocab_size})",
            )

    def propose(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        seed: int | None = None,
    ) -> DraftProposal:
        """Up to params.k draft tokens continuing context_ids, each with its q and matched order.

        seed only affects the sampling strategy (None: nondeterministic).
        """
        return self._propose(context_ids, self._checked(context_ids, params, seed), seed)

    def _checked(
        self, context_ids: Sequence[int] | np.ndarray, params: DraftParams, seed: int | None
    ) -> DraftParams:
        """Validate a request (InvalidArgumentError naming the field); return its resolved
        params."""
        params = self.resolve(params.validate())
        self.validate_context(context_ids)
        if seed is not None and seed < 0:
            raise InvalidArgumentError("seed", f"must be >= 0, got {seed}")
        return params

    def _propose(
        self, context_ids: Sequence[int] | np.ndarray, params: DraftParams, seed: int | None
    ) -> DraftProposal:
        """propose() for a checked context and resolved params."""
        overlay = None  # the request's context index, held for this proposal
        if params.overlay_weight > 0 and len(context_ids) > 1:
            overlay = self._overlays.checkout(np.asarray(context_ids, dtype=_BE32).tobytes())
        try:
            if params.drafts_tree and params.strategy == "sampling":
                return self._propose_sampled_tree(context_ids, params, seed, overlay)
            if params.drafts_tree:
                return self._propose_tree(context_ids, params, overlay)
            return self._propose_chain(context_ids, params, seed, overlay)
        finally:
            if overlay is not None:  # it may serve this request's next round
                self._overlays.checkin(overlay)

    def _propose_chain(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        seed: int | None,
        overlay: ContextIndex | None,
    ) -> DraftProposal:
        """A chain of up to params.k drafts (see the module's terms)."""
        max_order = self.max_order
        tail = _tail_key(context_ids, max_order)
        txn, dbs = self.graph.raw_lookup()
        every_order = params.effective_mixing != "backoff"
        greedy = params.strategy == "greedy"
        rng = None if greedy else np.random.default_rng(seed)
        proposal = DraftProposal()
        cache = self._greedy_cache if greedy and self.cache_size > 0 else None
        mix_key = _mix_key(params)
        min_prob = params.min_draft_prob
        running = 1.0  # q(d_1) * ... * q(d_i) so far
        for _ in range(params.k):
            source = "graph"
            found = _overlay_successors(overlay, tail)
            learned, signature = self._learned(tail)
            if found or learned:  # more counts than the graph's for this tail: combine them
                key = (tail, mix_key, params.overlay_weight, found, signature) if greedy else None
                step = cache.get(key) if cache is not None else None
                if step is None:
                    combined = self._combined(tail, txn, dbs, params, found, learned)
                    if greedy:
                        token, prob = self._argmax_combined(combined, params)
                        dist = _point_mass(token)
                    else:
                        ids, q = self._mixer.mix(
                            combined.orders, combined.ids, combined.counts, params
                        )
                        if _too_unlikely(running, q, min_prob, proposal):
                            break
                        token, dist, prob = _sample(ids, q, rng)
                    order, source = combined.orders[0], combined.source_of(token)
                    if cache is not None:
                        self._remember(key, (token, order, prob, source))
                else:
                    token, order, prob, source = step
                    dist = _point_mass(token)
            elif greedy:
                step = cache.get((tail, mix_key)) if cache is not None else None
                if step is None or (min_prob and step[2] != step[2]):  # missing, or NaN q
                    step = self._greedy_step(tail, txn, dbs, params, with_prob=min_prob > 0)
                    if cache is not None:
                        self._remember((tail, mix_key), step)
                token, order, prob = step
                if order == 0:
                    break  # dead end: a partial (possibly empty) draft
                dist = _point_mass(token)
            else:
                orders, values = _match(tail, txn, dbs, every_order)
                if not orders:
                    break
                ids, q = self._mixer.mix(orders, *_decode(values), params)
                if _too_unlikely(running, q, min_prob, proposal):
                    break
                token, dist, prob = _sample(ids, q, rng)
                order = orders[0]
            if greedy and running * prob < min_prob and proposal.token_ids:
                break  # adaptive length: d_i is too unlikely to survive verification
            running *= prob
            proposal.token_ids.append(token)
            proposal.distributions.append(dist)
            proposal.matched_orders.append(order)
            proposal.sources.append(source)
            tail = (tail + _PACK_ONE(token))[-4 * max_order :]
        return proposal

    def _propose_tree(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        overlay: ContextIndex | None,
    ) -> DraftProposal:
        """A draft tree (see the module's terms): best-first on path probability."""
        max_order = self.max_order
        root = _tail_key(context_ids, max_order)
        mix_key = _mix_key(params)
        proposal = DraftProposal()
        ties = itertools.count()
        # max-heap of candidate nodes:
        # (-path probability, tie, parent, token, depth, order, source, tail)
        frontier: list[tuple[float, int, int, int, int, int, str, bytes]] = []

        def offer_children(tail: bytes, parent: int, depth: int, path_prob: float) -> None:
            order, successors = self._tree_step(tail, params, mix_key, overlay)
            for token, q, source in successors:
                item = (-path_prob * q, next(ties), parent, token, depth, order, source, tail)
                heapq.heappush(frontier, item)

        offer_children(root, -1, 0, 1.0)
        while frontier and len(proposal.token_ids) < params.tree_nodes:
            neg_prob, _, parent, token, depth, order, source, tail = heapq.heappop(frontier)
            index = len(proposal.token_ids)
            proposal.token_ids.append(token)
            proposal.parents.append(parent)
            proposal.distributions.append(_point_mass(token))
            proposal.matched_orders.append(order)
            proposal.sources.append(source)
            if depth + 1 < params.k:
                child_tail = (tail + _PACK_ONE(token))[-4 * max_order :]
                offer_children(child_tail, index, depth + 1, -neg_prob)
        return proposal

    def _propose_sampled_tree(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        seed: int | None,
        overlay: ContextIndex | None,
    ) -> DraftProposal:
        """A tree of sampled drafts (see the module's terms): nodes expanded best-first on path
        probability, each with up to TREE_WIDTH children drawn from its q without replacement."""
        max_order = self.max_order
        root = _tail_key(context_ids, max_order)
        txn, dbs = self.graph.raw_lookup()
        rng = np.random.default_rng(seed)
        proposal = DraftProposal()
        ties = itertools.count()
        # max-heap of nodes to expand: (-path probability, tie, node index, depth, tail)
        frontier: list[tuple[float, int, int, int, bytes]] = [(-1.0, next(ties), -1, 0, root)]
        while frontier and len(proposal.token_ids) < params.tree_nodes:
            neg_prob, _, node, depth, tail = heapq.heappop(frontier)
            found = _overlay_successors(overlay, tail)
            orders, ids_list, counts_list, source_of = self._successor_counts(
                tail, txn, dbs, params, found, self._learned(tail)[0]
            )
            if not orders:
                continue  # a dead end: no children
            order = orders[0]
            ids, q = self._mixer.mix(orders, ids_list, counts_list, params)
            keep = q > 0
            ids, q = ids[keep], q[keep] / q[keep].sum()  # [support]
            draws = min(TREE_WIDTH, ids.size, params.tree_nodes - len(proposal.token_ids))
            for _ in range(draws):  # fixed before drawing: exactness needs that
                token, dist, prob = _sample(ids, q, rng)  # dist: q_i, the q it came from
                proposal.token_ids.append(token)
                proposal.parents.append(node)
                proposal.distributions.append(dist)
                proposal.matched_orders.append(order)
                proposal.sources.append(source_of(token))
                if depth + 1 < params.k:
                    path_prob = -neg_prob * prob
                    child_tail = (tail + _PACK_ONE(token))[-4 * max_order :]
                    index = len(proposal.token_ids) - 1
                    heapq.heappush(frontier, (-path_prob, next(ties), index, depth + 1, child_tail))
                others = ids != token  # without replacement: the next sibling's q_i
                ids, q = ids[others], q[others]
                if ids.size:
                    q = q / q.sum()
        return proposal

    def _successor_counts(
        self,
        tail: bytes,
        txn: lmdb.Transaction,
        dbs: list,
        params: DraftParams,
        found: tuple,
        learned: tuple,
    ) -> tuple[list[int], list[np.ndarray], list[np.ndarray], Callable[[int], str]]:
        """(matching orders, successor ids, counts, token -> its source) after tail, highest
        order first: the graph's counts, combined with learned (the live layer's successors
        for tail) and found (the overlay's, ContextIndex.successors) when there are any; no
        orders at a dead end."""
        if not (found or learned):
            every_order = params.effective_mixing != "backoff"
            return *_match_decoded(tail, txn, dbs, every_order), _from_graph
        combined = self._combined(tail, txn, dbs, params, found, learned)
        return combined.orders, combined.ids, combined.counts, combined.source_of

    def _learned(self, tail: bytes) -> tuple[tuple, tuple]:
        """(the live layer's successor counts for tail, their signature for cache keys), see
        LiveLayer.lookup; ((), ()) without a layer."""
        return self.live.lookup(tail) if self.live is not None else ((), ())

    def _combined(
        self,
        tail: bytes,
        txn: lmdb.Transaction,
        dbs: list,
        params: DraftParams,
        found: tuple,
        learned: tuple,
    ) -> Combined:
        """The graph's counts after tail plus live.weight times the live layer's (learned),
        then plus overlay_weight times the overlay's (found): c_graph + w_live c_live + w c_ctx
        per order. A token the live layer alone lists counts as "graph" (the draft tier's
        shared counts), one the overlay lists as "overlay" or "both"."""
        every_order = params.effective_mixing != "backoff"
        orders, ids, counts = _match_decoded(tail, txn, dbs, every_order)
        if learned:
            assert self.live is not None
            shared = combine(orders, ids, counts, learned, self.live.weight, every_order)
            orders, ids, counts = shared.orders, shared.ids, shared.counts
            if not found:
                return Combined(orders, ids, counts, ids, [])
        return combine(orders, ids, counts, as_arrays(found), params.overlay_weight, every_order)

    def _tree_step(
        self, tail: bytes, params: DraftParams, mix_key: tuple, overlay: ContextIndex | None
    ) -> _TreeStep:
        """(matched order, the TREE_WIDTH likeliest successors after tail with their q and
        source; ties: lowest id first); (0, []) at a dead end. Cached like greedy steps (mix_key:
        the params' _mix_key; with the overlay, keyed by its successor counts for tail too)."""
        found = _overlay_successors(overlay, tail)
        learned, signature = self._learned(tail)
        if found or learned:
            key: tuple = (tail, mix_key, params.overlay_weight, found, signature)
        else:
            key = (tail, mix_key)
        step = self._tree_cache.get(key)
        if step is None:
            txn, dbs = self.graph.raw_lookup()
            orders, ids_list, counts_list, source_of = self._successor_counts(
                tail, txn, dbs, params, found, learned
            )
            step = (0, [])  # a dead end
            if orders:
                best = self._mixer.top(orders, ids_list, counts_list, params, TREE_WIDTH)
                step = (orders[0], [(token, q, source_of(token)) for token, q in best])
            if self.cache_size > 0:
                self._remember(key, step, self._tree_cache)
        return step

    def next_round_drafts(
        self,
        context_ids: Sequence[int],
        draft: Sequence[int],
        params: DraftParams,
        seed: int | None,
        limit: int,
    ) -> list[NextRoundDraft]:
        """Drafts for the `limit` likeliest outcomes of verifying `draft` after context_ids,
        likeliest first.

        The likelihood of outcome (j, t) is estimated cheaply, with the highest matching order's
        successor frequencies f: f_1(d_1) * ... * f_j(d_j) * f_{j+1}(t). Each draft is
        ``propose(context_ids + d_1..d_j + [t], params, seed)``: exactly what a call made after
        verification returns, so using one never changes the output.
        """
        params = self._checked(context_ids, params, seed)  # once, not once per outcome
        context = [int(t) for t in context_ids]
        draft = [int(t) for t in draft]
        best: list[tuple[float, int, int, int]] = []  # min-heap of (estimate, -j, -rank, t)
        running = 1.0  # q_1(d_1) * ... * q_j(d_j)
        for j in range(len(draft) + 1):
            if limit <= 0 or running <= 0 or (len(best) == limit and running <= best[0][0]):
                break  # no outcome from position j on can beat the ones kept (q <= 1)
            successors = self._top_successors(context + draft[:j], limit + 1)
            if not successors:
                break  # dead end: the drafter knows no continuation here
            frequency_of_draft = 0.0
            for rank, (token, frequency) in enumerate(successors):
                if j < len(draft) and token == draft[j]:
                    frequency_of_draft = frequency
                    continue  # accepting d_{j+1} is not an outcome that stops at j
                item = (running * frequency, -j, -rank, token)
                if len(best) < limit:
                    heapq.heappush(best, item)
                elif item > best[0]:
                    heapq.heapreplace(best, item)
            running *= frequency_of_draft
        outcomes = [(-neg_j, token) for _, neg_j, _, token in sorted(best, reverse=True)]
        return [
            NextRoundDraft(j, token, self._propose(context + draft[:j] + [token], params, seed))
            for j, token in outcomes
        ]

    def _top_successors(self, context: list[int], count: int) -> list[tuple[int, float]]:
        """(token, relative frequency) of the `count` most frequent successors at the highest
        order matching context's tail ([] at a dead end)."""
        txn, dbs = self.graph.raw_lookup()
        orders, values = _match(_tail_key(context, self.max_order), txn, dbs, False)
        if not orders:
            return []
        flat = np.frombuffer(values[0], dtype=_U32)  # [2n]: n ids, then n counts (descending)
        n = flat.size >> 1
        total = float(flat[n:].sum())
        top = min(n, count)
        pairs = zip(flat[:top], flat[n : n + top], strict=True)
        return [(int(token), float(c) / total) for token, c in pairs]

    def _greedy_step(
        self,
        tail: bytes,
        txn: lmdb.Transaction,
        dbs: list,
        params: DraftParams,
        *,
        with_prob: bool,
    ) -> tuple[int, int, float]:
        """(argmax q, matched order, q(argmax)) after tail; (-1, 0, 0.0) at a dead end.

        with_prob=False may leave q(argmax) NaN (not needed without min_draft_prob: saves a
        numpy sum per backoff step); such a cached step is recomputed when it is needed.
        """
        mode = params.effective_mixing
        if mode == "witten-bell" and not with_prob:  # look at the highest order first
            orders, values = _match(tail, txn, dbs, every_order=False)
            if not orders:
                return _DEAD_END
            if _witten_bell_decided(values[0], params.escape_weight):
                return int(np.frombuffer(values[0], dtype=_U32, count=1)[0]), orders[0], math.nan
            lower_orders, lower_values = _match(tail, txn, dbs, True, top=orders[0] - 1)
            orders += lower_orders
            values += lower_values
        else:
            orders, values = _match(tail, txn, dbs, every_order=mode != "backoff")
            if not orders:
                return _DEAD_END
        token, prob = self._mixer.argmax(orders, *_decode(values), params, with_prob)
        return token, orders[0], prob

    def _argmax_combined(self, combined: Combined, params: DraftParams) -> tuple[int, float]:
        """(argmax q, q(argmax)) over combined counts (ties: lowest id)."""
        if len(combined.orders) == 1:  # combined counts are not sorted: no shortcut
            counts = combined.counts[0]
            top = counts.max()
            return int(combined.ids[0][counts == top].min()), float(top / counts.sum())
        return self._mixer.argmax(combined.orders, combined.ids, combined.counts, params)

    def _remember(self, key: tuple, step: tuple, cache: dict | None = None) -> None:
        """Insert into a step cache (default: the greedy one), evicting the oldest entry beyond
        cache_size."""
        cache = self._greedy_cache if cache is None else cache
        if key not in cache and len(cache) >= self.cache_size:
            # Concurrent evictions may race; losing one is harmless (the bound is approximate).
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del cache[next(iter(cache))]
        cache[key] = step

    def next_distribution(
        self, context_ids: Sequence[int], params: DraftParams
    ) -> tuple[SparseDistribution, int] | None:
        """(q, matched order) for the next token after context_ids, or None at a dead end.

        q here is the mixed (or highest-order) distribution itself, whatever the strategy.
        """
        params = self.resolve(params.validate())
        self.validate_context(context_ids)
        txn, dbs = self.graph.raw_lookup()
        tail = _tail_key(context_ids, self.max_order)
        orders, ids_list, counts_list, _ = self._successor_counts(
            tail, txn, dbs, params, (), self._learned(tail)[0]
        )
        if not orders:
            return None
        ids, q = self._mixer.mix(orders, ids_list, counts_list, params)
        return SparseDistribution(ids.astype(np.int64), q), orders[0]


@functools.lru_cache(maxsize=1 << 16)
def _point_mass(token: int) -> SparseDistribution:
    """The point mass at token, shared between drafts (its arrays are read-only)."""
    dist = SparseDistribution.point_mass(token)
    dist.token_ids.flags.writeable = False
    dist.probs.flags.writeable = False
    return dist


def _mix_key(params: DraftParams) -> tuple:
    """The parameters a greedy step depends on (besides the context tail)."""
    mode = params.effective_mixing
    if mode == "backoff":
        return (mode,)
    p = params
    if mode == "witten-bell":
        return (mode, p.escape_weight)
    return (mode, p.order_bias, p.reliability_weight, p.entropy_penalty, p.mix_temperature)


def _match(
    tail: bytes, txn: lmdb.Transaction, dbs: list, every_order: bool, top: int | None = None
) -> tuple[list[int], list[memoryview]]:
    """Backoff lookup: (matching orders, their LMDB values), highest order first.

    tail holds the last <= max_order context ids as big-endian uint32 (an order-o key is its
    last 4*o bytes); every_order=False stops at the highest match; top (default: the tail's
    length) is the highest order looked up.
    """
    orders: list[int] = []
    values: list[memoryview] = []
    get = txn.get
    for order in range(len(tail) >> 2 if top is None else top, 0, -1):
        value = get(tail[-4 * order :], db=dbs[order])
        if value is not None:
            orders.append(order)
            values.append(value)
            if not every_order:
                break
    return orders, values


def _match_decoded(
    tail: bytes, txn: lmdb.Transaction, dbs: list, every_order: bool
) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    """(matching orders, successor ids, counts) of the graph, highest order first."""
    orders, values = _match(tail, txn, dbs, every_order)
    return orders, *_decode(values)


def _witten_bell_decided(value: memoryview, escape_weight: float) -> bool:
    """Whether the highest matching order alone fixes the Witten-Bell argmax.

    With that order's counts a_1 >= a_2 >= ... (C in all, T distinct), b = escape_weight and
    lambda = C / (C + b T), q(x) = lambda * a_x / C + (1 - lambda) * Q(x) for some distribution Q
    of the lower orders, so q(top) - q(y) >= (a_1 - a_2 - b T) / (C + b T) > 0 for every other y
    when a_1 - a_2 > b T: the top successor is the strict argmax whatever the lower orders say.
    """
    flat = np.frombuffer(value, dtype=_U32)  # [2T]: T ids, then T counts
    types = flat.size >> 1
    second = int(flat[types + 1]) if types > 1 else 0
    return int(flat[types]) - second > escape_weight * types


def _decode(values: list[memoryview]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Zero-copy views (successor ids [n] uint32, counts [n] uint32) of each LMDB value."""
    ids_list: list[np.ndarray] = []
    counts_list: list[np.ndarray] = []
    for value in values:
        flat = np.frombuffer(value, dtype=_U32)  # [2n]: n ids, then n counts
        n = flat.size >> 1
        ids_list.append(flat[:n])
        counts_list.append(flat[n:])
    return ids_list, counts_list


def _from_graph(_token: int) -> str:
    return "graph"


def _overlay_successors(overlay: ContextIndex | None, tail: bytes) -> tuple:
    """The overlay's successor counts for tail (ContextIndex.successors); () without one."""
    return overlay.successors(tail) if overlay is not None else ()


def _tail_key(context_ids: Sequence[int] | np.ndarray, max_order: int) -> bytes:
    """The last <= max_order ids of the context, packed big-endian: the graph's key layout."""
    tail = [int(t) for t in context_ids[max(0, len(context_ids) - max_order) :]]
    return struct.pack(f">{len(tail)}I", *tail)


def _too_unlikely(running: float, q: np.ndarray, min_prob: float, proposal: DraftProposal) -> bool:
    """Adaptive length for a sampled draft: whether the draft ends before the next position,
    decided *before* sampling it, from the running probability so far and max q (the
    likeliest token's chance), never from the token drawn. So the token drafted at a position
    is always a plain draw from the q it reports: cutting the draft after a draw (when the
    drawn token's q is small) would make it a draw from q restricted to its likelier tokens,
    and the verifier, correcting against q, would no longer sample the target distribution."""
    return bool(proposal.token_ids) and running * float(q.max()) < min_prob


def _sample(
    ids: np.ndarray, q: np.ndarray, rng: np.random.Generator
) -> tuple[int, SparseDistribution, float]:
    """Draw one id from q by inverse CDF; return it, q (ids with q == 0 dropped) and q(id)."""
    if not q.all():  # an order whose softmax weight underflowed contributes nothing
        keep = q > 0
        ids, q = ids[keep], q[keep]
    cdf = np.cumsum(q)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    index = min(index, q.size - 1)
    return int(ids[index]), SparseDistribution(ids.astype(np.int64), q), float(q[index])
