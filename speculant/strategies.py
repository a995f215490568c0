"""The draft strategy names of :mod:`speculant.draft_params` ("greedy", "sampling") and their
values in the protobuf enum ``DraftStrategy``: one mapping for every client and server."""

from __future__ import annotations

from speculant.v1 import common_pb2

STRATEGY_TO_PROTO = {
    "greedy": common_pb2.DRAFT_STRATEGY_GREEDY,
    "sampling": common_pb2.DRAFT_STRATEGY_SAMPLING,
}
STRATEGY_FROM_PROTO = {value: name for name, value in STRATEGY_TO_PROTO.items()}
