"""Shared test fixtures: the test assets, and a session-wide tinystories graph.

Tests never touch the network. Most of them need only the in-repo demo kit (``demo/``: the
stories260K model and tokenizer, the first 4,101 stories of the tinystories corpus, the first 8
dev prompts), so the default suite runs from the repository alone. The few that need assets of
``../shared`` (see ../shared/ASSETS.md: the gpt-2 and phi-3 tokenizers, the full corpora,
random-llama-58m, more than 8 dev prompts) are marked ``needs_shared(ASSET)`` or call
:func:`shared_asset`; without the asset they skip with a line naming it, and with
``SPECULANT_REQUIRE_SHARED=1`` (set by ``.ci/run``) they fail instead. Set SPECULANT_SHARED to
use another copy of ../shared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Helper modules of the tests (not test modules): pytest rewrites their asserts too, so that a
# failing check shows its values.
pytest.register_assert_rewrite(
    "tests.exactness_checks",
    "tests.fuzz_calls",
    "tests.graph_checks",
    "tests.processes",
    "tests.sampling_checks",
    "tests.scripted_round",
)

# The shared fixtures (tests/fixtures/): any test module requests them by name.
pytest_plugins = [
    "tests.fixtures.e2e",
    "tests.fixtures.graphs",
    "tests.fixtures.models",
    "tests.fixtures.tls",
]

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
GPT2_TOKENIZER = SHARED / "tokenizers" / "gpt-2"
PHI3_TOKENIZER = SHARED / "tokenizers" / "phi-3"
TINYSTORIES_TRAIN = SHARED / "corpus" / "tinystories" / "train.txt"
DEV_PROMPTS = SHARED / "corpus" / "tinystories" / "dev_prompts.jsonl"
PYTHON_CORPUS = SHARED / "corpus" / "python"

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: no hub access from tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config: pytest.Config) -> None:
    import torch

    # One torch thread: the test model is tiny (one forward is about 1 ms), and on a shared
    # 2-core machine a second OpenMP thread that spins while the other core is busy makes every
    # forward 10-50x slower.
    torch.set_num_threads(1)
    config.addinivalue_line(
        "markers",
        "needs_shared(asset): needs ../shared/ASSET (skipped without it; "
        f"{REQUIRE_SHARED_ENV}=1 makes it a failure)",
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks slow the parameter combinations a test module lists in SLOW_CASES (test function
    name -> ids of its parametrized cases, e.g. one configuration on the full prompt set),
    where marking a whole parameter would move more than that case."""
    for item in items:
        slow_cases = getattr(getattr(item, "module", None), "SLOW_CASES", {})
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.id in slow_cases.get(item.originalname, ()):
            item.add_marker(pytest.mark.slow)


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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or fail) a test marked needs_shared(ASSET) before its fixtures run."""
    for marker in item.iter_markers("needs_shared"):
        for relative in marker.args:
            shared_asset(relative)


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


@pytest.fixture(scope="session")
def tinystories_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An order-5 graph of the demo kit's tinystories corpus with stories260K's tokenizer."""
    from builder import GraphBuilder

    out = tmp_path_factory.mktemp("graphs") / "tinystories"
    builder = GraphBuilder(tokenizer_name=str(STORIES_MODEL), max_order=5)
    builder.build_from_files([str(TINYSTORIES_CORPUS)], doc_separator=STORY_SEPARATOR)
    builder.save(out)
    return out


@pytest.fixture(scope="session")
def distilled_graph(tinystories_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of tinystories_graph with 256 greedy continuations of 64 tokens by stories260K
    distilled into it (speculant distill, prompts from the demo corpus)."""
    import shutil

    from distill.run import DistillOptions, distill_graph

    out = tmp_path_factory.mktemp("distilled") / "tinystories-distilled"
    shutil.copytree(tinystories_graph, out)
    distill_graph(
        DistillOptions(
            graph=str(out),
            model=str(STORIES_MODEL),
            corpus=[str(TINYSTORIES_CORPUS)],
            doc_separator=STORY_SEPARATOR,
            generations=256,
            max_tokens=64,
            device="cpu",
            progress=False,
        )
    )
    return out


@pytest.fixture(scope="session")
def other_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer folder ("other-tokenizer") like stories260K's but with one token renamed, so
    its fingerprint differs: for the tokenizer-mismatch tests, without ../shared."""
    out = tmp_path_factory.mktemp("tokenizers") / "other-tokenizer"
    out.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (out / name).write_bytes((STORIES_MODEL / name).read_bytes())
    spec = json.loads((STORIES_MODEL / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["<0x80>x"] = vocab.pop("<0x80>")  # a byte token: in no merge
    (out / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return out
