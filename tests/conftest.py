"""Shared test fixtures: paths into ../shared (offline assets) and a session-wide tinystories graph.

Tests never touch the network: models, tokenizers and corpora come from ../shared (see
../shared/ASSETS.md). Set SPECULANT_SHARED to use another copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPECULANT_SHARED", ROOT.parent / "shared")).resolve()
STORIES_MODEL = SHARED / "models" / "stories260K"
RANDOM_LLAMA = SHARED / "models" / "random-llama-58m"
GPT2_TOKENIZER = SHARED / "tokenizers" / "gpt-2"
PHI3_TOKENIZER = SHARED / "tokenizers" / "phi-3"
TINYSTORIES_TRAIN = SHARED / "corpus" / "tinystories" / "train.txt"
DEV_PROMPTS = SHARED / "corpus" / "tinystories" / "dev_prompts.jsonl"
PYTHON_CORPUS = SHARED / "corpus" / "python"
STORY_SEPARATOR = "\n\n\n"  # stories in train.txt are separated by two blank lines

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: no hub access from tests
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config: pytest.Config) -> None:
    import torch

    # One torch thread: the test model is tiny (one forward is about 1 ms), and on a shared
    # 2-core machine a second OpenMP thread that spins while the other core is busy makes every
    # forward 10-50x slower. Product code keeps torch's default.
    torch.set_num_threads(1)
    if not STORIES_MODEL.is_dir():
        raise pytest.UsageError(
            f"shared test assets not found at {SHARED}: put ../shared beside the project "
            "or set SPECULANT_SHARED"
        )


def load_dev_prompts() -> list[str]:
    with DEV_PROMPTS.open(encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


@pytest.fixture(scope="session")
def tinystories_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An order-5 graph of ../shared/corpus/tinystories/train.txt with stories260K's tokenizer."""
    from builder import GraphBuilder

    out = tmp_path_factory.mktemp("graphs") / "tinystories"
    builder = GraphBuilder(tokenizer_name=str(STORIES_MODEL), max_order=5)
    builder.build_from_files([str(TINYSTORIES_TRAIN)], doc_separator=STORY_SEPARATOR)
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
            corpus=[str(ROOT / "demo" / "tinystories-slice.txt")],
            doc_separator=STORY_SEPARATOR,
            generations=256,
            max_tokens=64,
            device="cpu",
            progress=False,
        )
    )
    return out
