"""pytest's hooks for this suite (one torch thread, the needs_shared marker, SLOW_CASES) and
a few session-wide fixtures; the assets and the helpers tests import are in
:mod:`tests.assets` (and the other helper modules), not here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.assets import (
    REQUIRE_SHARED_ENV,
    STORIES_MODEL,
    STORY_SEPARATOR,
    TINYSTORIES_CORPUS,
    shared_asset,
)

# Helper modules of the tests (not test modules): pytest rewrites their asserts too, so that a
# failing check shows its values.
pytest.register_assert_rewrite(
    "tests.exactness_checks",
    "tests.fuzz_calls",
    "tests.graph_checks",
    "tests.processes",
    "tests.sampling_checks",
    "tests.scripted_round",
    "tests.witten_bell_reference",
)

# The shared fixtures (tests/fixtures/): any test module requests them by name.
pytest_plugins = [
    "tests.fixtures.builds",
    "tests.fixtures.deploy",
    "tests.fixtures.e2e",
    "tests.fixtures.graphs",
    "tests.fixtures.http_api",
    "tests.fixtures.models",
    "tests.fixtures.tls",
]

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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (or fail) a test marked needs_shared(ASSET) before its fixtures run."""
    for marker in item.iter_markers("needs_shared"):
        for relative in marker.args:
            shared_asset(relative)


@pytest.fixture(scope="session")
def tinystories_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An order-5 graph of the demo kit's tinystories corpus with stories260K's tokenizer."""
    from builder import GraphBuilder

    out = tmp_path_factory.mktemp("graphs") / "tinystories"
    builder = GraphBuilder(tokenizer_name=str(STORIES_MODEL), max_order=5)
    builder.build_from_files([str(TINYSTORIES_CORPUS)], doc_separator=STORY_SEPARATOR)
    builder.save(out)
    return out


@pytest.fixture(scope="session", autouse=True)
def compiled_drafts(tinystories_graph: Path) -> None:
    """The compiled drafts' kernels (draft_service.greedy_kernels), compiled into numba's cache
    before any test runs: on a fresh clone that takes about 30 s, which a test's first
    request to a service it started must not wait for (services load them from the cache)."""
    from draft_service.drafting import Drafter
    from speculant.graph_reader import NGramGraph

    with NGramGraph.open(tinystories_graph) as graph:
        Drafter(graph)  # warms the kernels up


@pytest.fixture(scope="session")
def distilled_graph(tinystories_graph: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of tinystories_graph with 256 greedy continuations of 64 tokens by stories260K
    distilled into it (speculant distill, prompts from the demo corpus)."""
    import shutil

    from distill.options import DistillOptions
    from distill.run import distill_graph

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
