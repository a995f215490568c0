"""The seed's attentive mixing formula ("seed" mixing, which the DESIGN's formula and parameters
describe), computed by hand for the drafting-core tests: hand_q is the reference q of a context
on hand-made chains (tests.fixtures.graphs.CORE_CHAINS unless given)."""

from __future__ import annotations

import math
from functools import partial

from speculant.config import DraftParams
from tests.draft_checks import as_dict
from tests.fixtures.graphs import CORE_CHAINS

# DraftParams of the seed formula, with chains without the context overlay, unless a test says
SeedParams = partial(DraftParams, mixing="seed", tree_nodes=0, overlay_weight=0.0)


def hand_q(
    context: list[int], params: DraftParams, chains: dict = CORE_CHAINS
) -> tuple[dict[int, float], int]:
    """Reference q (dict id -> prob) and matched order, straight from the formula."""
    params = params.with_defaults()  # unset mixing parameters: the built-in defaults
    matching = []
    for order in range(min(len(context), max(chains)), 0, -1):
        succ = chains.get(order, {}).get(tuple(context[len(context) - order :]))
        if succ:
            matching.append((order, succ))
            if not params.attentive_mix:
                break
    if not matching:
        return {}, 0
    scores = []
    for order, succ in matching:
        total = sum(succ.values())
        entropy = -sum(c / total * math.log(c / total) for c in succ.values())
        scores.append(
            params.order_bias * math.log(order)
            + params.reliability_weight * math.log(1 + total)
            - params.entropy_penalty * entropy
        )
    top = max(scores)
    exps = [math.exp((s - top) / params.mix_temperature) for s in scores]
    weights = [e / sum(exps) for e in exps]
    q: dict[int, float] = {}
    for w, (_, succ) in zip(weights, matching, strict=True):
        total = sum(succ.values())
        for token, count in succ.items():
            q[token] = q.get(token, 0.0) + w * count / total
    return q, matching[0][0]


def plain(proposal) -> tuple:
    """A proposal as comparable plain data."""
    dists = [as_dict(d) for d in proposal.distributions]
    return proposal.token_ids, dists, proposal.matched_orders
