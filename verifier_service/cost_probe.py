"""Measuring the verifier's cost profile at start-up (speculant.cost_profile).

The probe times chain forwards of n new tokens appended to a scratch KV cache of CACHE_TOKENS
random tokens, through the verifier's own forward path (``LoadedModel.forward``, as Verify runs
it; the cache is cropped back after each), n ascending on PROBE_GRID, REPEATS times each after
one untimed warm-up forward (the fastest counts: the least disturbed by other load; once when a
forward is slow against the budget). When the next grid point would take the probe past its
time budget it stops, measuring the largest size once more if that fits (so the profile
interpolates up to it rather than extrapolates: on a CPU a forward over 2 new tokens can cost as
much as one over 8, and a slope read off the small sizes would say nothing of the large). The
verifier refreshes the profile from real Verify timings later. On a GPU the device is
synchronised around each forward.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from speculant.cost_profile import MAX_FORWARD_TOKENS, CostProfile
from verifier_service.model import LoadedModel

PROBE_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, MAX_FORWARD_TOKENS)
CACHE_TOKENS = 128
REPEATS = 3
DEFAULT_BUDGET_S = 2.0  # what the probe may take at start-up, at most about


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward(model: LoadedModel, cache: Any, ids: torch.Tensor, start: int, n: int) -> float:
    """Seconds of one forward over ids[start : start + n] appended to a cache of `start`
    tokens (as Verify runs it), the device synchronised around it; the cache is cropped back
    to `start` after it (not timed)."""
    _synchronize(model.device)
    begun = time.perf_counter()
    model.forward(cache, ids[start : start + n], start, n)
    _synchronize(model.device)
    elapsed = time.perf_counter() - begun
    model.crop(cache, start)
    return elapsed


def measure_cost_profile(model: LoadedModel, budget_s: float = DEFAULT_BUDGET_S) -> CostProfile:
    """The model's cost profile, measured within about budget_s seconds (cost(1) and cost(2) are
    measured whatever the budget; the largest size, measured last, may take it to twice that);
    refreshed by later observations."""
    cache_tokens = min(CACHE_TOKENS, max(1, model.max_context - MAX_FORWARD_TOKENS - 1))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(
        3, model.vocab_size, (cache_tokens + MAX_FORWARD_TOKENS,), generator=generator
    )
    ids = ids.to(model.device)
    cache = model.new_cache()
    model.forward(cache, ids[:cache_tokens], 0, logits_to_keep=1)
    room = model.max_context - cache_tokens
    grid = [n for n in PROBE_GRID if n <= room]
    points: dict[int, float] = {}
    started = time.perf_counter()

    def measure(n: int) -> None:
        first = timed_forward(model, cache, ids, cache_tokens, n)  # warms up this shape
        repeats = REPEATS if first * 40 < budget_s else 1  # slow forwards: one is enough
        points[n] = min(timed_forward(model, cache, ids, cache_tokens, n) for _ in range(repeats))

    for index, n in enumerate(grid):
        measure(n)
        left = budget_s - (time.perf_counter() - started)
        following = grid[index + 1] if index + 1 < len(grid) else None
        if following is None or len(points) < 2:
            continue
        # the next point costs about 2-4 forwards of its size, each ~ cost(n) * following / n
        if 4 * points[n] * following / n > left:
            top = grid[-1]  # the largest size: measured once if it fits, else extrapolated
            if top not in points and 2 * points[n] * top / n <= max(left, 0) + budget_s:
                measure(top)
            break
    return CostProfile.from_points(points, "measured", refresh=True)
