"""Draft trees: up to tree_nodes tokens, at most k deep, grown best-first by path probability
q(t_1) * ... * q(t_d) under the mixed q.

``greedy``: each node offers its TREE_WIDTH likeliest successors (each q a point mass); the
greedy chain is its first branch. ``sampling``: each node's children are SAMPLED_TREE_WIDTH
draws from its q *without replacement* (fewer where q has fewer tokens or the budget ends; how
many is fixed before drawing), child i reporting q_i = q without the earlier children, renormalised:
what the verifier's recursive rejection rule needs (verifier_service.sampling). The verifier
checks every branch in one forward pass and keeps the path it accepts.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draft_service.chain import sample
from draft_service.overlay import ContextIndex
from draft_service.step_cache import StepCache, mix_key
from draft_service.successors import Successors, overlay_successors
from speculant.config import DraftParams
from speculant.graph_format import extend_tail, tail_key
from speculant.types import DraftProposal, point_mass

# Successors a greedy tree node offers, at most: the tree is grown best-first on path
# probability, so a wide cap lets an uncertain node take several children where they are
# likelier than a deeper step. Measured by greedy replay (SmolLM2 chat answers, a distilled graph,
# 64 nodes, 16 deep, overlay 64): tau 3.45 / 3.70 / 3.79 with 3 / 8 / 16 (64: 3.79); on
# tinystories at 12 nodes 3.05 with 3, 3.07 with 16.
TREE_WIDTH = 16
# Children a sampled tree node draws (without replacement) each time it is expanded: fixed
# before drawing (exactness), so a wide one would spend the budget on unlikely siblings.
SAMPLED_TREE_WIDTH = 3
# A tree step: (matched order, [(successor, q, source), ...] likeliest first), (0, []) at a dead end
TreeStep = tuple[int, list[tuple[int, float, str]]]


@dataclass(frozen=True)
class TreeDrafter:
    """Draft trees from one graph's successors; greedy tree steps kept in a StepCache keyed
    like the chain's."""

    successors: Successors
    cache: StepCache

    def propose_greedy(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        overlay: ContextIndex | None,
    ) -> DraftProposal:
        """A greedy draft tree after context_ids: best-first on path probability.

        A node's successors come likeliest first, so its next sibling is offered only once the
        node itself is taken: the heap then pops in the same order as if every successor had
        been offered at once, for about two pushes per node instead of TREE_WIDTH."""
        window = self.successors.graph.window  # the context tokens a lookup reads
        key_of_mix = mix_key(params)
        step_after = self.step
        tree_nodes, max_depth = params.tree_nodes, params.k
        proposal = DraftProposal()
        token_ids, parents, path_probs = proposal.token_ids, proposal.parents, proposal.path_probs
        ties = itertools.count()
        push, pop = heapq.heappush, heapq.heappop
        # max-heap of candidates: (-path probability, tie, parent node, parent's path
        # probability, depth, the parent's step and tail, the candidate's rank in that step)
        frontier: list[tuple[float, int, int, float, int, TreeStep, bytes, int]] = []
        root = tail_key(context_ids, window)
        step = step_after(root, params, key_of_mix, overlay)
        if step[1]:
            push(frontier, (-step[1][0][1], next(ties), -1, 1.0, 0, step, root, 0))
        while frontier and len(token_ids) < tree_nodes:
            neg_prob, _, parent, parent_prob, depth, step, tail, rank = pop(frontier)
            order, successors = step
            token, _, source = successors[rank]
            index = len(token_ids)
            path_prob = -neg_prob
            token_ids.append(token)
            parents.append(parent)
            proposal.distributions.append(point_mass(token))
            proposal.matched_orders.append(order)
            proposal.sources.append(source)
            path_probs.append(path_prob)
            rank += 1
            if rank < len(successors):  # its next sibling
                sibling = -parent_prob * successors[rank][1]
                push(frontier, (sibling, next(ties), parent, parent_prob, depth, step, tail, rank))
            if depth + 1 < max_depth:  # its first child
                child_tail = extend_tail(tail, token, window)
                child = step_after(child_tail, params, key_of_mix, overlay)
                if child[1]:
                    first = -path_prob * child[1][0][1]
                    push(
                        frontier,
                        (first, next(ties), index, path_prob, depth + 1, child, child_tail, 0),
                    )
        return proposal

    def propose_sampled(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        seed: int | None,
        overlay: ContextIndex | None,
    ) -> DraftProposal:
        """A tree of sampled drafts: nodes expanded best-first on path probability, each with
        up to SAMPLED_TREE_WIDTH children drawn from its q without replacement."""
        successors = self.successors
        window = successors.graph.window  # the context tokens a lookup reads
        root = tail_key(context_ids, window)
        rng = np.random.default_rng(seed)
        proposal = DraftProposal()
        ties = itertools.count()
        # max-heap of nodes to expand: (-path probability, tie, node index, depth, tail)
        frontier: list[tuple[float, int, int, int, bytes]] = [(-1.0, next(ties), -1, 0, root)]
        while frontier and len(proposal.token_ids) < params.tree_nodes:
            neg_prob, _, node, depth, tail = heapq.heappop(frontier)
            found = overlay_successors(overlay, tail)
            orders, ids_list, counts_list, source_of = successors.counts(
                tail, params, found, successors.learned(tail)[0]
            )
            if not orders:
                continue  # a dead end: no children
            order = orders[0]
            ids, q = successors.mixer.mix(orders, ids_list, counts_list, params)
            keep = q > 0
            ids, q = ids[keep], q[keep] / q[keep].sum()  # [support]
            budget = params.tree_nodes - len(proposal.token_ids)
            draws = min(SAMPLED_TREE_WIDTH, ids.size, budget)
            for _ in range(draws):  # fixed before drawing: exactness needs that
                token, dist, prob = sample(ids, q, rng)  # dist: q_i, the q it came from
                proposal.token_ids.append(token)
                proposal.parents.append(node)
                proposal.distributions.append(dist)
                proposal.matched_orders.append(order)
                proposal.sources.append(source_of(token))
                path_prob = -neg_prob * prob
                proposal.path_probs.append(path_prob)
                if depth + 1 < params.k:
                    child_tail = extend_tail(tail, token, window)
                    index = len(proposal.token_ids) - 1
                    heapq.heappush(frontier, (-path_prob, next(ties), index, depth + 1, child_tail))
                others = ids != token  # without replacement: the next sibling's q_i
                ids, q = ids[others], q[others]
                if ids.size:
                    q = q / q.sum()
        return proposal

    def step(
        self, tail: bytes, params: DraftParams, key_of_mix: tuple, overlay: ContextIndex | None
    ) -> TreeStep:
        """(matched order, the TREE_WIDTH likeliest successors after tail with their q and
        source; ties: lowest id first); (0, []) at a dead end. Cached (keyed by the overlay's
        and the live layer's counts for tail too, where they have any)."""
        successors = self.successors
        found = overlay_successors(overlay, tail)
        learned, signature = successors.learned(tail)
        if found or learned:
            key: tuple = (tail, key_of_mix, params.overlay_weight, found, signature)
        else:
            key = (tail, key_of_mix)
        step = self.cache.entries.get(key)
        if step is None:
            orders, ids_list, counts_list, source_of = successors.counts(
                tail, params, found, learned
            )
            step = (0, [])  # a dead end
            if orders:
                best = successors.mixer.top(orders, ids_list, counts_list, params, TREE_WIDTH)
                step = (orders[0], [(token, q, source_of(token)) for token, q in best])
            if self.cache.enabled:
                self.cache.remember(key, step)
        return step
