"""The demo kit stands in for ../shared in the default suite: check that it is what the tests
take it for (the same model, a prefix of the corpus, the first dev prompts), and that a missing
shared asset skips a test with a line naming it, or fails it where CI requires ../shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.assets import (
    DEMO_PROMPT_COUNT,
    DEMO_PROMPTS,
    DEV_PROMPTS,
    REQUIRE_SHARED_ENV,
    ROOT,
    SHARED,
    STORIES_MODEL,
    TINYSTORIES_CORPUS,
    TINYSTORIES_TRAIN,
    load_dev_prompts,
    needs,
)


@needs(SHARED / "models" / "stories260K")
def test_demo_model_is_the_shared_model() -> None:
    shared = SHARED / "models" / "stories260K"
    for path in sorted(shared.iterdir()):
        assert (STORIES_MODEL / path.name).read_bytes() == path.read_bytes(), path.name


@needs(TINYSTORIES_TRAIN)
def test_demo_corpus_is_a_prefix_of_the_training_corpus() -> None:
    slice_bytes = TINYSTORIES_CORPUS.read_bytes()
    with TINYSTORIES_TRAIN.open("rb") as f:
        assert f.read(len(slice_bytes)) == slice_bytes


@needs(DEV_PROMPTS)
def test_demo_prompts_are_the_first_dev_prompts() -> None:
    demo = [json.loads(line)["prompt"] for line in DEMO_PROMPTS.read_text().splitlines()]
    assert len(demo) == DEMO_PROMPT_COUNT
    assert load_dev_prompts(None)[:DEMO_PROMPT_COUNT] == demo == load_dev_prompts(8)


MISSING_ASSET_TEST = """
from tests.assets import shared_asset

def test_uses_a_missing_asset():
    shared_asset("models/no-such-model")
"""


@pytest.mark.parametrize(("require", "outcome"), [("", "1 skipped"), ("1", "1 failed")])
def test_a_missing_shared_asset_skips_or_fails(tmp_path, require: str, outcome: str) -> None:
    (tmp_path / "test_missing.py").write_text(MISSING_ASSET_TEST, encoding="utf-8")
    env = {**os.environ, REQUIRE_SHARED_ENV: require, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    command += ["-rsf", "-q", "--rootdir", str(tmp_path), str(tmp_path)]
    completed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert outcome in completed.stdout, completed.stdout
    assert "needs ../shared/models/no-such-model" in completed.stdout
