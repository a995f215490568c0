"""The README's main job: `speculant demo` on the demo kit in the repo (no ../shared needed)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.assets import ROOT


def test_demo_kit_is_small_and_licensed():
    demo = ROOT / "demo"
    size = sum(p.stat().st_size for p in demo.rglob("*") if p.is_file())
    assert size <= 5 * 1024 * 1024
    notes = (demo / "README.md").read_text(encoding="utf-8")
    assert "MIT" in notes and "CDLA-Sharing-1.0" in notes


def test_demo_builds_a_graph_and_matches_plain_decoding(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = (ROOT / "demo" / "prompts.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "demo",
            "--graph",
            str(tmp_path / "graph"),
            "--prompts",
            str(prompts),
            "--max-tokens",
            "24",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "outputs identical to plain greedy decoding: 2/2" in completed.stdout
    assert "tokens per verifier call" in completed.stdout
    assert "speedup over plain decoding" in completed.stdout
    meta = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "graph-info", str(tmp_path / "graph"), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    info = json.loads(meta.stdout)
    assert info["max_order"] == 5
    assert info["corpus_documents"] == 4101  # the stories of demo/tinystories-slice.txt
