"""Draft proposals on the wire: the ProposeRequest for a context and parameters, and the
DraftProposal in a response."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from speculant.config import DEFAULT_MAX_CONTEXT_TOKENS
from speculant.request_context import REQUEST_ID
from speculant.strategies import STRATEGY_TO_PROTO
from speculant.types import (
    DraftParams,
    DraftProposal,
    SparseDistribution,
)
from speculant.v1 import (
    common_pb2,
    draft_pb2,
)

log = logging.getLogger(__name__)


def propose_request(
    context_ids: Sequence[int], params: DraftParams, seed: int | None
) -> draft_pb2.ProposeRequest:
    """The ProposeRequest for a drafting call (every parameter explicit), naming the request
    being served (see speculant.request_context)."""
    return draft_pb2.ProposeRequest(
        request_id=REQUEST_ID.get() or "",
        context_token_ids=context_ids[-DEFAULT_MAX_CONTEXT_TOKENS:],  # what a replica takes
        k=params.k,
        strategy=STRATEGY_TO_PROTO[params.strategy],
        attentive_mix=params.attentive_mix,
        order_bias=params.order_bias,
        mix_temperature=params.mix_temperature,
        reliability_weight=params.reliability_weight,
        entropy_penalty=params.entropy_penalty,
        seed=seed,
        mixing=params.mixing,
        escape_weight=params.escape_weight,
        min_draft_prob=params.min_draft_prob,
        overlay_weight=params.overlay_weight,
        tree_nodes=params.tree_nodes,
    )


def is_greedy_request(request: draft_pb2.ProposeRequest) -> bool:
    return request.strategy == common_pb2.DRAFT_STRATEGY_GREEDY


def proposal_from_message(
    message: draft_pb2.ProposeResponse | draft_pb2.NextRoundDraft, greedy: bool
) -> DraftProposal:
    """The DraftProposal in a ProposeResponse or a NextRoundDraft. Greedy drafts' q's are point
    masses at their tokens, which the verifier assumes anyway: not decoded (distributions=[])."""
    return DraftProposal(
        token_ids=list(message.draft_token_ids),
        distributions=[]
        if greedy
        else [
            SparseDistribution(np.asarray(d.token_ids, dtype=np.int64), np.asarray(d.probs))
            for d in message.distributions
        ],
        matched_orders=list(message.matched_orders),
        sources=list(message.draft_sources),
        parents=list(getattr(message, "draft_parents", ())),
    )
