"""Comparing ProposeResponses: everything but draft_seconds (the drafter's own time, which
differs from call to call)."""

from __future__ import annotations

from speculant.v1 import draft_pb2


def untimed(response: draft_pb2.ProposeResponse) -> draft_pb2.ProposeResponse:
    """A copy of the response without its draft_seconds."""
    copy = draft_pb2.ProposeResponse()
    copy.CopyFrom(response)
    copy.ClearField("draft_seconds")
    return copy
