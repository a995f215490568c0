"""scripts/gpu_check.sh, the GPU check, on this CPU: `--smoke` runs every step at tiny sizes (the
whole run is slow: 80-160 s here), and its summary fails a step whose greedy outputs differ
from Hugging Face's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.assets import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
HELPER = ROOT / "scripts" / "gpu_check.py"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable}


def _helper(*args: str) -> subprocess.CompletedProcess:
    env = {**_env(), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(HELPER), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow
def test_the_smoke_run_writes_every_step_and_outputs_match_greedy_decoding(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--smoke", "--out", str(out), "--work", str(work)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    figures = {p.name: json.loads(p.read_text()) for p in out.glob("*.json")}
    loads = {f"load-llama3-8b-random-c{c}.json" for c in (1, 8, 32)}
    expected = {"env.json", "build-stories260k.json", "identity-stories260k.json", "cost.json"}
    expected |= {"random-model.json", "generate-llama3-8b-random.json", "summary.json", *loads}
    expected |= {"draft-tree.json", "draft-chain.json", "load-trees-c8.json", "load-chains-c8.json"}
    assert expected <= set(figures)
    summary = figures["summary.json"]
    assert summary["passed"] and summary["mode"] == "smoke"
    assert set(summary["skipped"]) == {"identity-smollm2", "generate-smollm2", "load-smollm2"}
    identity = figures["identity-stories260k.json"]["summary"]
    assert set(identity) == {"hf", "plain", "embedded k=16 mix=on", "services k=16 mix=on"}
    assert all(row["exact_mismatches"] == 0 for row in identity.values())
    model = figures["random-model.json"]
    assert model["config"]["vocab_size"] == 128256 and model["config"]["num_key_value_heads"] == 2
    assert [m["name"] for m in figures["cost.json"]["cost"]["models"]] == [
        "stories260K",
        "llama3-8b-random",
    ]
    for name in (*loads, "load-trees-c8.json", "load-chains-c8.json"):
        assert figures[name]["errors"] == {} and figures[name]["requests"] > 0
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert figures["draft-tree.json"]["params"]["tree_nodes"] > 0
    assert figures["draft-chain.json"]["params"]["tree_nodes"] == 0
    assert all(figures[f"draft-{d}.json"]["in_process"]["compiled"] for d in ("tree", "chain"))
    assert len(lines) == len(summary["steps"]) == 12
    assert "no SmolLM2 folder (--smollm PATH)" in done.stdout
    assert not _processes_naming(work), "speculant up or a service outlived the script"


def _processes_naming(path: Path) -> list[str]:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if str(path) in cmdline:
            found.append(cmdline)
    return found


def test_an_output_that_differs_from_greedy_decoding_fails_the_identity_step(tmp_path):
    row = {"system": "plain", "prompts": 2, "tokens_per_second_total": 10.0, "tau_total": 1.0}
    result = {
        "settings": {"device": "cuda", "dtype": "float32"},
        "summary": {"hf": {**row, "system": "hf"}, "plain": {**row, "exact_mismatches": 1}},
    }
    path = tmp_path / "identity.json"
    path.write_text(json.dumps(result))
    result["round_overhead"] = {"services": {"beyond_forward_p50_ms": 1.234}}
    path.write_text(json.dumps(result))
    for kind, status in (("generate", 0), ("identity", 1)):
        done = _helper("report", "--out", str(tmp_path), "--step", kind, "--kind", kind, str(path))
        assert done.returncode == status, done.stderr
    assert "[FAIL] identity" in done.stdout and "plain: 1 of 2 differ" in done.stdout
    assert "services beyond the forward +1.23 ms p50" in done.stdout
    failed = _helper("report", "--out", str(tmp_path), "--step", "cost", "--rc", "3")
    assert failed.returncode == 1 and "exit status 3" in failed.stdout
    finish = _helper("finish", "--out", str(tmp_path), "--mode", "gpu")
    assert finish.returncode == 1, finish.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed"] == ["identity", "cost"] and not summary["passed"]


def test_the_random_model_has_llama_3_8b_shape():
    """The llama3-8b shape's parameter count is Meta-Llama-3-8B's (built on the meta device)."""
    sys.path.insert(0, str(HELPER.parent))
    try:
        from gpu_check import SHAPES
    finally:
        sys.path.remove(str(HELPER.parent))
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPES["llama3-8b"]))
    assert sum(p.numel() for p in model.parameters()) == 8_030_261_248


def test_usage_and_unknown_arguments():
    usage = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "--smoke" in usage.stdout and "--smollm" in usage.stdout
    wrong = subprocess.run(["bash", str(SCRIPT), "--fast"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown argument --fast" in wrong.stderr


def test_the_script_is_executable():
    assert os.access(SCRIPT, os.X_OK) and Path(SCRIPT).read_text().startswith("#!/usr/bin/env bash")


def test_the_draft_step_reports_each_drafts_speed(tmp_path):
    files = []
    for name, nodes, median_us, stream_ms in (("tree", 64, 689.1, 1.93), ("chain", 0, 190.4, 0.81)):
        result = {
            "params": {"k": 16, "tree_nodes": nodes},
            "in_process": {"median_us": median_us, "compiled": True},
            "grpc": [{"rpc": "unary", "p50_ms": 9.9}, {"rpc": "stream", "p50_ms": stream_ms}],
        }
        files.append(tmp_path / f"draft-{name}.json")
        files[-1].write_text(json.dumps(result))
    done = _helper(
        "report", "--out", str(tmp_path), "--step", "draft", "--kind", "draft", *map(str, files)
    )
    assert done.returncode == 0, done.stderr
    assert "tree of 64, k 16: 689 us in process, 1.93 ms over a stream" in done.stdout
    assert "chain of k 16: 190 us in process, 0.81 ms over a stream" in done.stdout


def test_the_batching_step_compares_trees_with_chains(tmp_path):
    files = []
    for name, rate, errors in (("trees", 120.0, {}), ("chains", 100.0, {"UNAVAILABLE": 1})):
        result = {
            "concurrency": 8,
            "tokens_per_second": rate,
            "requests": 40,
            "errors": errors,
            "ttft_ms": {"p50": 20.0},
            "itl_ms": {"p50": 5.0},
        }
        files.append(tmp_path / f"load-{name}-c8.json")
        files[-1].write_text(json.dumps(result))
    done = _helper(
        "report", "--out", str(tmp_path), "--step", "batching", "--kind", "batching",
        *map(str, files),
    )  # fmt: skip
    assert "trees / chains 1.20x: c=8 120 tok/s" in done.stdout
    assert " against c=8 100 tok/s" in done.stdout
    assert done.returncode == 1 and "[FAIL] batching" in done.stdout  # a failed request fails it
