"""The test assets: the in-repo demo kit and ../shared, and how a test asks for the latter.

Tests never touch the network. Most of them need only the in-repo demo kit (``demo/``: the
stories260K model and tokenizer, the first 4,101 stories of the tinystories corpus, the first 8
dev prompts), so the default suite runs from the repository alone. The few that need assets of
``../shared`` (see ../shared/ASSETS.md: the gpt-2 and phi-3 tokenizers, the full corpora,
random-llama-58m, more than 8 dev prompts) are marked ``needs_shared(ASSET)`` (:func:`needs`) or
call :func:`shared_asset`; without the asset they skip with a line naming it, and with
``SPECULANT_REQUIRE_SHARED=1`` (set by ``.ci/run``) they fail instead. Set SPECULANT_SHARED to
use another copy of ../shared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPECULANT_SHARED", ROOT.parent / "shared")).resolve()
REQUIRE_SHARED_ENV = "SPECULANT_REQUIRE_SHARED"

# The demo kit (always there). The model is byte-identical to ../shared/models/stories260K, the
# corpus is the first 3.2 MB of ../shared/corpus/tinystories/train.txt and the prompts are the
# first lines of dev_prompts.jsonl (tests/test_assets.py checks all three where ../shared is).
DEMO = ROOT / "demo"
STORIES_MODEL = DEMO / "stories260K"
TINYSTORIES_CORPUS = DEMO / "tinystories-slice.txt"
DEMO_PROMPTS = DEMO / "prompts.jsonl"
STORY_SEPARATOR = "\n\n\n"  # stories in the tinystories corpus are separated by two blank lines

# Assets of ../shared only (tests that use them are marked needs_shared).
RANDOM_LLAMA = SHARED / "models" / "random-llama-58m"
SMOLLM2_MODEL = SHARED / "models" / "smollm2-135m-instruct"
GPT2_TOKENIZER = SHARED / "tokenizers" / "gpt-2"
PHI3_TOKENIZER = SHARED / "tokenizers" / "phi-3"
TINYSTORIES_TRAIN = SHARED / "corpus" / "tinystories" / "train.txt"
DEV_PROMPTS = SHARED / "corpus" / "tinystories" / "dev_prompts.jsonl"
PYTHON_CORPUS = SHARED / "corpus" / "python"


def _missing(relative: str) -> str:
    return f"needs ../shared/{relative} (not in the demo kit; see ../shared/ASSETS.md)"


def shared_asset(relative: str) -> Path:
    """The path of ../shared/RELATIVE; skips the calling test when it is missing (fails it
    under SPECULANT_REQUIRE_SHARED=1)."""
    path = SHARED / relative
    if not path.exists():
        if os.environ.get(REQUIRE_SHARED_ENV) == "1":
            pytest.fail(f"{_missing(relative)}, and {REQUIRE_SHARED_ENV}=1", pytrace=False)
        pytest.skip(_missing(relative))
    return path


def needs(*paths: Path) -> pytest.MarkDecorator:
    """The needs_shared marker for some of this module's ../shared paths."""
    return pytest.mark.needs_shared(*(str(path.relative_to(SHARED)) for path in paths))


DEMO_PROMPT_COUNT = 8  # demo/prompts.jsonl: the first 8 dev prompts


def _read_prompts(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def load_dev_prompts(count: int | None = None, start: int = 0) -> list[str]:
    """Tinystories dev prompts start..count-1 (all 64 when count is None): from the demo kit
    when it has them (the same prompts), else from ../shared (the test skips without it)."""
    if count is not None and count <= DEMO_PROMPT_COUNT:
        return _read_prompts(DEMO_PROMPTS)[start:count]
    prompts = _read_prompts(shared_asset("corpus/tinystories/dev_prompts.jsonl"))
    return prompts[start:count]


def dev_prompt_sets(count: int | None = None) -> list:
    """Parameters for a fixture of the first `count` dev prompts (all when None), in two sets:
    the demo kit's 8 (always run) and the others (need ../shared); pass each to
    ``load_dev_prompts(*param)``."""
    demo = pytest.param((min(count or DEMO_PROMPT_COUNT, DEMO_PROMPT_COUNT), 0), id="prompts0-8")
    if count is not None and count <= DEMO_PROMPT_COUNT:
        return [demo]
    rest = f"prompts8-{count or 'all'}"
    return [demo, pytest.param((count, DEMO_PROMPT_COUNT), id=rest, marks=needs(DEV_PROMPTS))]
