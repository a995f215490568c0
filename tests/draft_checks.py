"""Comparing drafts: ProposeResponses on everything but draft_seconds (the drafter's own time,
which differs from call to call), and a draft's distributions as plain dicts."""

from __future__ import annotations

from speculant.v1 import draft_pb2


def untimed(response: draft_pb2.ProposeResponse) -> draft_pb2.ProposeResponse:
    """A copy of the response without its draft_seconds."""
    copy = draft_pb2.ProposeResponse()
    copy.CopyFrom(response)
    copy.ClearField("draft_seconds")
    return copy


def as_dict(dist) -> dict[int, float]:
    """A draft distribution as {token id: probability}."""
    return dict(zip(dist.token_ids.tolist(), dist.probs.tolist(), strict=True))
