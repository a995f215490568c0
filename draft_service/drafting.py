"""The drafting core: draft tokens from an n-gram graph (a plain library, no gRPC).

:class:`Drafter` is the facade: it checks a request, resolves its parameters and hands it to
the chain (:mod:`draft_service.chain`) or tree (:mod:`draft_service.tree`) drafter, which read
successor counts (:mod:`draft_service.successors`) and keep steps (:mod:`draft_service.step_cache`).

Terms:
- *backoff*: at each draft position, look up the last n tokens of the context for
  n = max_order down to 1 and draft from the highest order that matches; after each drafted
  token the context grows by it and is matched again.
- *long context* (opt-in, NGramGraph.use_long_context): the tails looked up are graph.window
  tokens long, and the longest match of at least LONGEST_FROM tokens joins the orders 1..max_order.
- *matched order*: the highest order whose context matched at a position (with long context, the
  longest match where it counts).
- *dead end*: no order matches; drafting stops there and the draft is partial (possibly empty).
- *q*: the distribution the drafted token was drawn from. With attentive mixing (the default), the
  mix of every matching order's successor distribution under ``params.mixing`` (see
  :mod:`draft_service.mixing`); with ``mixing="backoff"`` or ``attentive_mix=False``, the
  successor distribution of the matched order alone. ``greedy`` drafts argmax q (ties: lowest
  token id), and the q it reports is then a point mass at that token, since that is the
  distribution it was drawn from; ``sampling`` draws from q with a numpy Generator and reports q.
- *running probability* of draft token d_i: q(d_1) * ... * q(d_i), with q the mixed distribution
  (for ``greedy`` the mass of argmax q before it is reported as a point mass): the drafter's own
  estimate that the draft survives to position i.
- *draft tree*: with ``params.drafts_tree`` (tree_nodes > 0) the draft is a tree of up to
  tree_nodes tokens, at most k deep, grown best-first by path probability q(t_1) * ... * q(t_d)
  under the mixed q. ``greedy``: each node offers its TREE_WIDTH likeliest successors (each q a
  point mass); the greedy chain is its first branch.
  ``sampling``: each node's children are TREE_WIDTH draws from its q *without replacement*
  (fewer where q has fewer tokens or the budget ends; how many is fixed before drawing), child
  i reporting q_i = q without the earlier children, renormalised: what the verifier's recursive
  rejection rule needs (verifier_service.sampling). The verifier checks every branch in one
  forward pass and keeps the path it accepts.
- *overlay*: with ``overlay_weight`` > 0 the whole context_ids (prompt + generated tokens) is a
  second source of n-grams; wherever it has successors for the tail, q is mixed from the combined
  counts c_graph,o + overlay_weight * c_context,o (:mod:`draft_service.overlay`), else from the
  graph alone as above. Each draft token's *source* ("graph", "overlay" or "both") says which
  sources listed it as a successor at the orders q was mixed from.
- *live layer*: with a :class:`~draft_service.learning.LiveLayer` (what the draft service
  learned from the generations it served), its counts join the graph's first: c_graph,o +
  live.weight * c_live,o, then the overlay's as above. Its tokens count as source "graph" (the
  draft tier's shared counts). Drafts change as the layer learns; outputs do not (drafts are
  only proposals).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from draft_service.chain import ChainDrafter
from draft_service.greedy_kernels import CompiledDrafts
from draft_service.learning import LiveLayer
from draft_service.mixing import Mixer
from draft_service.overlay import ContextIndexCache
from draft_service.step_cache import DEFAULT_CACHE_SIZE, StepCache
from draft_service.successors import Successors
from draft_service.tree import TreeDrafter
from speculant.config import DraftParams
from speculant.errors import InvalidArgumentError
from speculant.graph_format import encode_context, tail_key
from speculant.graph_reader import NGramGraph
from speculant.types import DraftProposal, SparseDistribution


class Drafter:
    """Proposes up to k draft tokens continuing a context, from one opened graph (thread-safe)."""

    def __init__(
        self,
        graph: NGramGraph,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        live: LiveLayer | None = None,
    ) -> None:
        """cache_size: greedy steps kept per cache (0: none); live: a live layer (what this
        service learned from generations it served) whose counts join the graph's (see
        :mod:`draft_service.learning`)."""
        self.graph = graph
        self.live = live
        self.max_order = graph.max_order
        self.window = graph.window  # the context tokens a lookup reads (the longest match)
        self.vocab_size = graph.vocab_size
        self.cache_size = cache_size
        self.successors = Successors(graph, live, Mixer(graph.vocab_size))
        self.chain = ChainDrafter(self.successors, StepCache(cache_size))
        self.tree = TreeDrafter(self.successors, StepCache(cache_size))
        # greedy drafts in compiled code, where the graph has a suffix index
        self.compiled = CompiledDrafts(graph) if graph.indexed else None
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

        seed only affects the sampling strategy (None: nondeterministic). The proposal's
        ``seconds`` is the time this call took (what drafting costs, without any RPC).
        """
        started = time.perf_counter()
        proposal = self._propose(context_ids, self._checked(context_ids, params, seed), seed)
        proposal.seconds = time.perf_counter() - started
        proposal.graph_id = self.graph.graph_id
        return proposal

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
            overlay = self._overlays.checkout(encode_context(context_ids))
        try:
            if self.compiled is not None and self.compiled.serves(params):
                return self.compiled.propose(context_ids, params, overlay, self.live)
            if params.drafts_tree and params.strategy == "sampling":
                return self.tree.propose_sampled(context_ids, params, seed, overlay)
            if params.drafts_tree:
                return self.tree.propose_greedy(context_ids, params, overlay)
            return self.chain.propose(context_ids, params, seed, overlay)
        finally:
            if overlay is not None:  # it may serve this request's next round
                self._overlays.checkin(overlay)

    def next_distribution(
        self, context_ids: Sequence[int], params: DraftParams
    ) -> tuple[SparseDistribution, int] | None:
        """(q, matched order) for the next token after context_ids, or None at a dead end.

        q here is the mixed (or highest-order) distribution itself, whatever the strategy.
        """
        params = self.resolve(params.validate())
        self.validate_context(context_ids)
        tail = tail_key(context_ids, self.window)
        successors = self.successors
        orders, ids_list, counts_list, _ = successors.counts(
            tail, params, (), successors.learned(tail)[0]
        )
        if not orders:
            return None
        ids, q = successors.mixer.mix(orders, ids_list, counts_list, params)
        return SparseDistribution(ids.astype(np.int64), q), orders[0]
