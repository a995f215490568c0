"""scripts/fold_tune.py's own logic: matching answers to their folds, the paired bootstrap of
a gain, and the grid (the replays are distill.replay's, tested in test_tune.py)."""

from __future__ import annotations

import importlib.util

import pytest

from speculant.config import DraftConfig
from tests.assets import ROOT

SPEC = importlib.util.spec_from_file_location("fold_tune", ROOT / "scripts" / "fold_tune.py")
assert SPEC is not None and SPEC.loader is not None
fold_tune = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(fold_tune)


def record(function: str, kind: str = "ask") -> dict:
    return {"kind": kind, "function": function, "messages": [{"role": "user", "content": function}]}


def test_each_record_is_matched_to_its_fold() -> None:
    folds = [[record("a"), record("b", "rag")], [record("c")], [record("d", "example")]]
    train = [record("c"), record("a"), record("d", "example"), record("b", "rag")]
    assert fold_tune.fold_of_each(train, folds) == [1, 0, 2, 0]


def test_a_record_in_no_fold_or_in_two_is_an_error() -> None:
    with pytest.raises(ValueError, match="in no fold"):
        fold_tune.fold_of_each([record("z")], [[record("a")]])
    with pytest.raises(ValueError, match="folds 0 and 1"):
        fold_tune.fold_of_each([record("a")], [[record("a")], [record("a")]])


def test_the_paired_gain_is_the_ratio_of_tau_over_all_tokens() -> None:
    base = [(100, 50), (100, 25)]  # tau 200 / 75
    other = [(100, 40), (100, 25)]  # tau 200 / 65
    gain, low, high = fold_tune.paired_gain(base, other, resamples=200)
    assert gain == pytest.approx(75 / 65 - 1)
    assert 0 <= low <= gain <= high <= 50 / 40 - 1  # each resample's gain lies in between


def test_the_same_counts_gain_nothing_however_noisy_the_prompts() -> None:
    counts = [(128, 20), (128, 60), (50, 40), (128, 33)]
    assert fold_tune.paired_gain(counts, counts) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        fold_tune.paired_gain(counts, counts[:2])


def test_the_grid_starts_with_the_defaults_and_covers_both_mixings() -> None:
    grid = fold_tune.candidates([2.0, 8.0], [0.0, 64.0])
    names = [name for name, _ in grid]
    assert names[0] == "default" and grid[0][1].mixing is None
    assert len(grid) == 1 + 2 * (2 + 1)
    assert "wb b=2 ov=0" in names and "backoff ov=64" in names
    assert all(params.draft_size == "fixed" for _, params in grid)


def test_the_checked_candidates_are_the_default_the_best_and_each_parameter_alone() -> None:
    ov = DraftConfig().overlay_weight  # the default overlay weight, and 4x it
    grid = fold_tune.candidates([8.0, 16.0], [ov, 4 * ov])
    tau = {f"wb b=16 ov={4 * ov:g}": 3.7, f"wb b=16 ov={ov:g}": 3.6, f"wb b=8 ov={4 * ov:g}": 3.65}
    rows = [{"name": name, "tau_all_tokens": tau.get(name, 3.5)} for name, _ in grid]
    names = [name for name, _ in fold_tune.checked(rows, grid)]
    assert names == ["default", *tau, f"backoff ov={ov:g}"]
    without_backoff = [(n, p) for n, p in grid if not n.startswith("backoff")]
    rows = [r for r in rows if not r["name"].startswith("backoff")]
    assert f"backoff ov={ov:g}" not in [n for n, _ in fold_tune.checked(rows, without_backoff)]
