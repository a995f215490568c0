"""Chain drafts: up to k tokens, each drafted after the context and the drafts before it.

At each position: the successor counts after the tail (:mod:`draft_service.successors`), mixed
into q; ``greedy`` drafts argmax q and reports a point mass (the distribution it was drawn
from), ``sampling`` draws from q and reports q. A dead end (no order matches) ends the draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draft_service.overlay import ContextIndex
from draft_service.step_cache import StepCache, mix_key
from draft_service.successors import Successors, overlay_successors
from speculant.config import DraftParams
from speculant.graph_format import extend_tail, tail_key
from speculant.types import DraftProposal, SparseDistribution, point_mass


@dataclass(frozen=True)
class ChainDrafter:
    """Chains of drafts from one graph's successors; greedy steps kept in a StepCache keyed by
    (tail, mix_key) or, with overlay or live counts, (tail, mix_key, overlay weight, overlay
    counts, live signature) -> (token, matched order, q(token)[, source])."""

    successors: Successors
    cache: StepCache

    def propose(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        seed: int | None,
        overlay: ContextIndex | None,
    ) -> DraftProposal:
        """A chain of up to params.k drafts after context_ids (checked, params resolved)."""
        successors = self.successors
        window = successors.graph.window  # the context tokens a lookup reads
        tail = tail_key(context_ids, window)
        greedy = params.strategy == "greedy"
        rng = None if greedy else np.random.default_rng(seed)
        proposal = DraftProposal()
        cache = self.cache.entries if greedy and self.cache.enabled else None
        remember = self.cache.remember
        key_of_mix = mix_key(params)
        running = 1.0  # q(d_1) * ... * q(d_i) so far
        for _ in range(params.k):
            found = overlay_successors(overlay, tail)
            learned, signature = successors.learned(tail)
            if not greedy:
                drawn = self.sampled_step(tail, params, found, learned, rng)
                if drawn is None:
                    break
                token, dist, prob, order, source = drawn
            elif found or learned:  # more counts than the graph's for this tail: combine them
                key = (tail, key_of_mix, params.overlay_weight, found, signature)
                step = cache.get(key) if cache is not None else None
                if step is None:
                    combined = successors.combined(tail, params, found, learned)
                    token, prob = successors.argmax_combined(combined, params)
                    step = (token, combined.orders[0], prob, combined.source_of(token))
                    if cache is not None:
                        remember(key, step)
                token, order, prob, source = step
                dist = point_mass(token)
            else:
                step = cache.get((tail, key_of_mix)) if cache is not None else None
                if step is None:  # q(argmax) too: the draft's path probabilities need it
                    step = successors.greedy_step(tail, params, with_prob=True)
                    if cache is not None:
                        remember((tail, key_of_mix), step)
                token, order, prob = step
                if order == 0:
                    break  # dead end: a partial (possibly empty) draft
                dist, source = point_mass(token), "graph"
            running *= prob
            proposal.token_ids.append(token)
            proposal.distributions.append(dist)
            proposal.matched_orders.append(order)
            proposal.sources.append(source)
            proposal.path_probs.append(running)
            tail = extend_tail(tail, token, window)
        return proposal

    def sampled_step(
        self,
        tail: bytes,
        params: DraftParams,
        found: tuple,
        learned: tuple,
        rng: np.random.Generator,
    ) -> tuple[int, SparseDistribution, float, int, str] | None:
        """One sampled draft after tail: (token, q, q(token), matched order, source), or None
        at a dead end."""
        successors = self.successors
        orders, ids_list, counts_list, source_of = successors.counts(tail, params, found, learned)
        if not orders:
            return None
        ids, q = successors.mixer.mix(orders, ids_list, counts_list, params)
        token, dist, prob = sample(ids, q, rng)
        return token, dist, prob, orders[0], source_of(token)


def sample(
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
