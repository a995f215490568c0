"""Model and tokenizer names as users type them: a hub name works from the local cache and fails
fast (with the way to go offline) when the hub is out of reach; a relative local folder is
recorded by its resolved path, so it still loads from another directory. No network: the
"hub" is a closed localhost port, and the cache is built here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from speculant.hub import endpoint_reachable
from tests.assets import ROOT, STORIES_MODEL

HUB_NAME = "speculant-test/stories260K"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


@pytest.fixture
def unreachable_hub_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose hub endpoint refuses connections, with an empty cache, not offline
    by setting."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE" and "PROXY" not in k}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path / "hf"))
    return env


def cache_model(hf_home: Path, repo: str, source: Path) -> None:
    """A Hugging Face cache entry for repo holding source's files (what a download leaves)."""
    entry = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    revision = "0" * 40
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(revision)
    snapshot = entry / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for path in source.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())


def test_endpoint_probe():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        assert endpoint_reachable(f"http://127.0.0.1:{listening.getsockname()[1]}")
    assert not endpoint_reachable(f"http://127.0.0.1:{closed_port()}")


def test_a_hub_name_not_downloaded_fails_fast_when_the_hub_is_unreachable(unreachable_hub_env):
    started = time.monotonic()
    command = [sys.executable, "-m", "launcher.cli", "serve-verifier", "--model", HUB_NAME]
    completed = subprocess.run(
        [*command, "--port", "0", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env=unreachable_hub_env,
    )
    elapsed = time.monotonic() - started
    assert completed.returncode == 1, completed.stderr
    assert "Traceback" not in completed.stderr and "Retrying" not in completed.stderr
    (line,) = [line for line in completed.stderr.splitlines() if ": error: " in line]
    assert (
        line.startswith("speculant serve-verifier: error: cannot load model") and HUB_NAME in line
    )
    assert "cannot be reached" in line and "HF_HUB_OFFLINE=1" in line
    assert elapsed < 30, f"{elapsed:.0f} s: retried instead of failing fast"


LOAD_FROM_CACHE = """
from speculant.config import VerifierConfig
from speculant.tokenizer import load_tokenizer
from verifier_service.model import LoadedModel

loaded = LoadedModel.load(VerifierConfig(model_name="{name}", device="cpu"))
tokenizer = load_tokenizer("{name}")
print(loaded.name, loaded.vocab_size, tokenizer("Once upon a time").input_ids[0])
"""


def test_a_downloaded_hub_name_loads_from_the_cache_without_the_hub(unreachable_hub_env):
    """The path real users take with a hub name, with the network down: the cached copy."""
    cache_model(Path(unreachable_hub_env["HF_HOME"]), HUB_NAME, STORIES_MODEL)
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-c", LOAD_FROM_CACHE.format(name=HUB_NAME)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**unreachable_hub_env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [HUB_NAME, "512", "1"]
    assert time.monotonic() - started < 60 and "Retrying" not in completed.stderr


def test_relative_local_folders_are_recorded_resolved(tmp_path, monkeypatch):
    from builder import GraphBuilder
    from speculant.config import VerifierConfig
    from verifier_service.model import LoadedModel
    from verifier_service.verifier import LocalVerifier

    monkeypatch.chdir(ROOT)
    relative = os.path.relpath(STORIES_MODEL, ROOT)  # demo/stories260K
    corpus = tmp_path / "c.txt"
    corpus.write_text("Once upon a time there was a cat.")
    builder = GraphBuilder(tokenizer_name=relative, max_order=2, progress=False)
    builder.build_from_files([str(corpus)])
    meta = builder.save(tmp_path / "graph")
    builder.close()
    assert meta.tokenizer_name == str(STORIES_MODEL)
    loaded = LoadedModel.load(VerifierConfig(model_name=relative, device="cpu"))
    assert loaded.name == str(STORIES_MODEL)
    verifier = LocalVerifier(VerifierConfig(model_name=relative, device="cpu"), model=None)
    try:
        assert verifier.info.model_name == verifier.info.tokenizer_name == str(STORIES_MODEL)
    finally:
        verifier.close()


def test_a_tokenizer_the_gateway_cannot_load_hints_at_the_flag():
    from gateway.engine import GenerationEngine
    from speculant.tokenizer import TokenizerLoadError

    fingerprint = "sha256:" + "0" * 64
    verifier = SimpleNamespace(
        info=SimpleNamespace(
            tokenizer_name="./models/only-on-the-verifier-host",
            tokenizer_fingerprint=fingerprint,
            model_name="m",
        )
    )
    drafter = SimpleNamespace(
        graph_info=lambda timeout_s=None: SimpleNamespace(
            name="g",
            graph_names=["g"],
            tokenizer_name="t",
            tokenizer_fingerprint=fingerprint,
            max_order=3,
            graph_path="/graphs/g",
            graph_version=1,
        )
    )
    engine = GenerationEngine(drafter, verifier)  # type: ignore[arg-type]
    with pytest.raises(TokenizerLoadError, match="--tokenizer NAME_OR_DIR"):
        engine.coordinator()
