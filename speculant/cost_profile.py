"""What one verifier forward costs, by the number of new tokens it runs: the *cost profile*.

Terms: cost(n) is the wall time in seconds of one forward over n new tokens (the pending token
and n - 1 draft tokens) appended to a session's KV cache. On a CPU a small model's forward grows
with every token (compute-bound); on a GPU a forward over 64 tokens costs about what one costs
(memory-bound), so the draft size that pays differs by hardware (see gateway.rounds.draft_sizing).

A profile holds cost(n) for n = 1..MAX_FORWARD_TOKENS (a dense table). It comes from:

- a measurement: the verifier times forwards at start-up (verifier_service.cost_probe) on a
  grid of n, and the table is filled by linear interpolation between the grid points and
  extrapolation past the last one (along the steeper of the last segment and the average
  slope: an unknown cost is rather over- than under-estimated); then :meth:`observe`
  refreshes it from real timings (an exponential moving average per n, each sample clipped to
  [1/2, 2] x the current value so a burst of load moves it slowly);
- ``flat``: every forward costs the same (as on a GPU for small drafts);
- a file: ``speculant bench cost --json`` output (the first model's medians, or the one whose
  name matches), or a profile's own JSON (:meth:`to_json`).

Reading is the table itself, which need not grow with n: on a CPU a forward over 2 or 3 new
tokens can cost more than one over 4 to 12 (this torch build's BLAS runs 2-3 rows about as slowly
as 2-3 single rows and switches to a faster kernel from 4: SmolLM2-135M on this project's CPU, at
start-up and in real Verify calls alike, docs/benchmarks.md). A running maximum (a forward over
more tokens never costs less) would price 4-12 new tokens at what 3 cost, and the sizer would
verify 3-11 drafts far too rarely; read as measured, it verifies 3 drafts where they cost less
than 1 or 2.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speculant.config import MAX_DRAFT_K
from speculant.types import ModelInfo

MAX_FORWARD_TOKENS = MAX_DRAFT_K + 1  # the pending token and at most MAX_DRAFT_K drafts
REFRESH_WEIGHT = 0.05  # EMA weight of one observed forward
CLIP = 2.0  # an observation moves the table by at most a factor of CLIP per sample


class CostProfileError(ValueError):
    """A cost profile file that cannot be read (one line: what and where)."""


@dataclass
class CostProfile:
    """cost(n) in seconds for n = 1..MAX_FORWARD_TOKENS new tokens (see the module docstring).

    ``source`` says where it came from: "measured", "flat" or "file:PATH"; ``refresh``: whether
    :meth:`observe` updates it (measured profiles only).
    """

    seconds: list[float]  # [n - 1]: a forward over n new tokens
    source: str = "measured"
    refresh: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.seconds) != MAX_FORWARD_TOKENS or not all(s > 0 for s in self.seconds):
            raise CostProfileError(
                f"a cost profile needs {MAX_FORWARD_TOKENS} positive costs, got {self.seconds!r}"
            )

    @classmethod
    def from_points(
        cls, points: Mapping[int, float], source: str = "measured", refresh: bool = False
    ) -> CostProfile:
        """A profile through measured (n, seconds) points: linear between them, flat before the
        first, extrapolated along the last segment past the last (never below it)."""
        known = sorted((int(n), float(s)) for n, s in points.items() if int(n) >= 1)
        if not known or any(not s > 0 for _, s in known):
            raise CostProfileError(f"cost points must be positive seconds, got {dict(points)!r}")
        seconds = [_interpolate(known, n) for n in range(1, MAX_FORWARD_TOKENS + 1)]
        return cls(seconds, source, refresh)

    @classmethod
    def flat(cls, seconds: float = 1e-3) -> CostProfile:
        """Every forward costs `seconds`, whatever its size."""
        return cls([seconds] * MAX_FORWARD_TOKENS, "flat", refresh=False)

    def cost(self, tokens: int) -> float:
        """Seconds of a forward over `tokens` new tokens (clamped to 1..MAX_FORWARD_TOKENS)."""
        return self.seconds[min(max(tokens, 1), MAX_FORWARD_TOKENS) - 1]

    def costs(self, tokens: int) -> list[float]:
        """[cost(1), ..., cost(tokens)] (tokens clamped to MAX_FORWARD_TOKENS)."""
        return self.seconds[: min(max(tokens, 1), MAX_FORWARD_TOKENS)]

    def observe(self, tokens: int, seconds: float) -> None:
        """Refresh cost(tokens) from one real forward of that size (no-op unless refreshing)."""
        if not self.refresh or not 1 <= tokens <= MAX_FORWARD_TOKENS or not seconds > 0:
            return
        with self._lock:
            old = self.seconds[tokens - 1]
            sample = min(max(seconds, old / CLIP), old * CLIP)
            self.seconds[tokens - 1] = old + REFRESH_WEIGHT * (sample - old)

    def copy(self, refresh: bool | None = None) -> CostProfile:
        """An independent copy (refresh: override whether it refreshes)."""
        with self._lock:
            seconds = list(self.seconds)
        return CostProfile(seconds, self.source, self.refresh if refresh is None else refresh)

    def summary(self, counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 65)) -> str:
        """A short line for logs: cost(n) in ms and relative to cost(1) at a few n."""
        one = self.cost(1)
        cells = ", ".join(
            f"{n}: {self.cost(n) * 1e3:.3g} ms ({self.cost(n) / one:.2f}x)" for n in counts
        )
        return f"verify cost ({self.source}) {cells}"

    def to_json(self) -> dict[str, Any]:
        return {"verify_cost": {"source": self.source, "seconds": list(self.seconds)}}

    @classmethod
    def load(cls, path: str | Path, model_name: str = "") -> CostProfile:
        """A profile from a JSON file: ``speculant bench cost --json`` output (the model whose
        path or name ends like model_name, else the first) or :meth:`to_json`'s. Fixed (not
        refreshed): it says what forwards cost where it was measured."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CostProfileError(f"cannot read cost profile {path}: {exc}") from exc
        source = f"file:{path}"
        if isinstance(data, dict) and isinstance(data.get("verify_cost"), dict):
            seconds = data["verify_cost"].get("seconds")
            if not isinstance(seconds, list) or len(seconds) != MAX_FORWARD_TOKENS:
                raise CostProfileError(f"{path}: verify_cost.seconds needs {MAX_FORWARD_TOKENS}")
            return cls([float(s) for s in seconds], source)
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, list) or not models:
            raise CostProfileError(
                f"{path}: not a cost profile (expected `speculant bench cost --json` output)"
            )
        model = _matching_model(models, model_name)
        try:
            points = {int(n): f["median_ms"] / 1e3 for n, f in model["forward"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise CostProfileError(f"{path}: a model's forward figures are malformed") from exc
        return cls.from_points(points, source)


def _matching_model(models: list[Any], model_name: str) -> dict[str, Any]:
    wanted = Path(model_name).name if model_name else ""
    for model in models:
        if wanted and isinstance(model, dict) and Path(str(model.get("model", ""))).name == wanted:
            return model
    return models[0]


def _interpolate(known: list[tuple[int, float]], n: int) -> float:
    """Linear between known points; past the last one along the steeper of the last segment
    and the average slope from the first point (an unknown cost is rather over- than
    under-estimated: a draft that looks cheap but is not would cost more than plain decoding)."""
    if n <= known[0][0] or len(known) == 1:
        return known[0][1] if n <= known[0][0] else max(known[-1][1], known[0][1])
    for (x0, y0), (x1, y1) in itertools.pairwise(known):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = known[-2], known[-1]
    (first_x, first_y) = known[0]
    slope = max((y1 - y0) / (x1 - x0), (y1 - first_y) / (x1 - first_x), 0.0)
    return y1 + slope * (n - x1)


VERIFY_COST_MODES = ("measured", "flat")  # or a path to a JSON file


def verify_cost_profile(spec: str, info: ModelInfo) -> CostProfile:
    """The profile a coordinator sizes drafts by, from ``--verify-cost SPEC``: "measured" (the
    verifier's own as it reports it now; flat when it reports none), "flat" (every forward costs
    what the verifier's one-token forward costs) or the path of a JSON file
    (:meth:`CostProfile.load`). CostProfileError for a bad file."""
    seconds = list(info.verify_cost_seconds)
    measured = (
        CostProfile(seconds, "measured")
        if len(seconds) == MAX_FORWARD_TOKENS and all(s > 0 for s in seconds)
        else None
    )
    if spec == "measured":
        return measured if measured is not None else CostProfile.flat()
    if spec == "flat":
        return CostProfile.flat(measured.cost(1) if measured is not None else 1e-3)
    return CostProfile.load(spec, info.model_name)
