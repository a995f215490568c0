"""Where each round's time goes: a :class:`RoundClock` times the parts of one draft-and-verify
round as the coordinator runs them, and :class:`RoundTimes` keeps every round's parts of a
generation (in GenerationStats.round_times, GenerationStats.round_times in gateway.proto).

The parts of a round (seconds; they add up to the round's wall time, ``round``):

- ``draft``: the drafter's own work (DraftProposal.seconds: the draft service's
  ``ProposeResponse.draft_seconds``, or the in-process drafter's);
- ``draft_hop``: the rest of the time the round waited for its draft calls: over the services
  the gRPC hop to the draft service (serialization, transport, the service's handling), embedded
  the in-process call;
- ``sizer``: the cost-aware sizing (gateway.rounds.draft_sizing): plan, cut and observe;
- ``forward``: the verifier's forward pass and sampling (VerifyResult.seconds:
  ``VerifyResponse.forward_seconds`` over the services);
- ``verify_hop``: the rest of the Verify call: the gRPC hop to the verifier service, or the
  in-process call;
- ``gateway``: everything else: the coordinator's own work (planning, the constraint's drafts,
  taking the tokens into the output and detokenizing them, bookkeeping).

The prefill (a generation's first round) is not among them. Timing a round costs a few
``time.perf_counter`` calls and seven floats.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import TypeVar

# Every part of a round, in the order a round runs them; "round" is their sum.
PARTS = ("draft", "draft_hop", "sizer", "forward", "verify_hop", "gateway")
FIELDS = ("round", *PARTS)

T = TypeVar("T")


class RoundClock:
    """Times one round: the calls charged to the draft call, the sizer or the verify call, and
    the work the backends report doing inside them."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.draft_call = 0.0  # waiting for draft calls (the drafter's work included)
        self.sizer = 0.0
        self.verify_call = 0.0  # the Verify call (the forward included)
        self.draft = 0.0  # the drafter's own seconds, as it reports them
        self.forward = 0.0  # the verifier's own seconds, as it reports them

    def timed(self, part: str, work: Callable[..., T], *args: object) -> T:
        """work(*args), its wall seconds added to `part` (draft_call, sizer or verify_call)."""
        t0 = time.perf_counter()
        try:
            return work(*args)
        finally:
            setattr(self, part, getattr(self, part) + time.perf_counter() - t0)

    def parts(self) -> tuple[float, ...]:
        """The round now: its wall seconds, then each part's (FIELDS' order). A backend's own
        seconds count at most its call's, so no part is negative and they add up to the round."""
        wall = time.perf_counter() - self.started
        draft = min(self.draft, self.draft_call)
        forward = min(self.forward, self.verify_call)
        gateway = max(0.0, wall - self.draft_call - self.sizer - self.verify_call)
        return (
            wall,
            draft,
            self.draft_call - draft,
            self.sizer,
            forward,
            self.verify_call - forward,
            gateway,
        )


class RoundTimes:
    """Every round's parts of one generation: one array of seconds per field (FIELDS)."""

    def __init__(self) -> None:
        self.seconds: dict[str, array] = {name: array("d") for name in FIELDS}

    def __len__(self) -> int:
        return len(self.seconds["round"])

    def add(self, parts: tuple[float, ...]) -> None:
        """One round's figures, as RoundClock.parts gives them."""
        for name, value in zip(FIELDS, parts, strict=True):
            self.seconds[name].append(value)

    def as_dict(self) -> dict[str, list[float]]:
        """{field: [seconds of each round]} (GenerationStats.round_times in gateway.proto)."""
        return {name: values.tolist() for name, values in self.seconds.items()}
