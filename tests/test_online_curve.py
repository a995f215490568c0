"""scripts/online_curve.py: tau of held-out traces against a live layer's learned answers, on the
demo kit's graph (replays only, no model): answers the layer has learned draft better."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from tests.assets import ROOT

SCRIPT = ROOT / "scripts" / "online_curve.py"


def test_learned_answers_raise_tau(tinystories_graph: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    # random token sequences: text the corpus graph cannot predict
    answers = [
        {"index": i, "prompt_ids": [rng.randrange(3, 512) for _ in range(8)],
         "continuation_ids": [rng.randrange(3, 512) for _ in range(40)]}
        for i in range(6)
    ]  # fmt: skip
    (tmp_path / "served.json").write_text(json.dumps(answers))
    (tmp_path / "eval.json").write_text(json.dumps(answers))
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps({"prompt": "x", "kind": f"set-{i % 2}"}) + "\n" for i in range(6))
    )
    out = tmp_path / "curve.json"
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--graph", str(tinystories_graph),
         "--served", str(tmp_path / "served.json"), "--eval", str(tmp_path / "eval.json"),
         "--eval-prompts", str(tmp_path / "eval.jsonl"), "--served-counts", "0,6",
         "--max-tokens", "32", "--json", str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    cold, warm = json.loads(out.read_text())["rows"]
    assert (cold["served"], warm["served"]) == (0, 6)
    assert set(warm["tau_ci95"]) == {"all", "set-0", "set-1", "set-*"}
    # the layer learned these very answers: most of each is drafted and accepted
    assert cold["tau_ci95"]["all"][0] < 1.5
    assert warm["tau_ci95"]["all"][0] > 2 * cold["tau_ci95"]["all"][0]
