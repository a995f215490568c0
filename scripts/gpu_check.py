"""The Python half of ``scripts/gpu_check.sh``: its checks, the random-weights model it builds,
the readiness wait for ``speculant up``, and the one-line summary of each step.

    python scripts/gpu_check.py preflight --mode gpu|smoke --json OUT/env.json
    python scripts/gpu_check.py random-model --shape llama3-8b|tiny --tokenizer DIR --out DIR ...
    python scripts/gpu_check.py ports 3
    python scripts/gpu_check.py wait --address 127.0.0.1:PORT --pid PID --timeout S
    python scripts/gpu_check.py report --out DIR --step NAME --kind KIND --rc RC FILE...
    python scripts/gpu_check.py finish --out DIR

``report`` prints one line per step and appends it to ``OUT/steps.jsonl``; ``finish`` writes
``OUT/summary.json`` and exits 1 when a step failed. A step fails when its command failed, and
the identity steps (``--kind identity``) also when an output differs from Hugging Face greedy
decoding; ``--kind load`` also when a request failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# (module, the distribution that provides it): what the project needs at run time
REQUIRED = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("tokenizers", "tokenizers"),
    ("safetensors", "safetensors"),
    ("huggingface_hub", "huggingface_hub"),
    ("numpy", "numpy"),
    ("numba", "numba"),
    ("grpc", "grpcio"),
    ("grpc_health", "grpcio-health-checking"),
    ("grpc_reflection", "grpcio-reflection"),
    ("google.protobuf", "protobuf"),
    ("lmdb", "lmdb"),
    ("pydantic", "pydantic"),
    ("pydantic_settings", "pydantic-settings"),
    ("llguidance", "llguidance"),
    ("starlette", "starlette"),
    ("uvicorn", "uvicorn"),
    ("jinja2", "jinja2"),
    ("psutil", "psutil"),
    ("prometheus_client", "prometheus-client"),
    ("tqdm", "tqdm"),
)
# the project's modules the steps run (the stubs check the grpcio and protobuf versions)
PROJECT_MODULES = (
    "speculant.v1.gateway_pb2_grpc",
    "launcher.cli",
    "bench.generate",
    "bench.cost",
    "bench.load",
    "gateway.api.server",
    "gateway.api.app",
)

LLAMA3_8B = {  # Meta-Llama-3-8B's config.json, less its tokenizer's ids
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
SHAPES = {
    "llama3-8b": LLAMA3_8B,
    # the same architecture at a size a CPU runs in seconds (--smoke); the same vocabulary
    "tiny": {
        **LLAMA3_8B,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 224,
    },
}
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges", "chat_")


# --- preflight -----------------------------------------------------------------------------


def missing_modules() -> list[str]:
    """'module (pip install DIST)' for every required module that does not import."""
    missing = []
    for module, dist in REQUIRED:
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install
            missing.append(f"{module} (distribution {dist}: {type(exc).__name__}: {exc})")
    return missing


def project_errors() -> list[str]:
    errors = []
    for module in PROJECT_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a version check of the stubs, a missing dependency
            errors.append(f"{module}: {type(exc).__name__}: {exc}")
    return errors


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for _, dist in REQUIRED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def gpu_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        info.update(
            device_name=props.name,
            device_memory_bytes=props.total_memory,
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
    return info


def preflight(args: argparse.Namespace) -> int:
    """Every module the steps need imports, and (gpu mode) CUDA is there; env.json."""
    missing = missing_modules()
    if missing:
        print("gpu_check: these Python modules are missing:", file=sys.stderr)
        for line in missing:
            print(f"  - {line}", file=sys.stderr)
        print(
            "Install them (pip install -e . on a machine with network), or, offline, carry "
            "wheels: run `scripts/gpu_check.sh --fetch-wheels DIR` where pip works, copy DIR "
            "along and pass `--wheels DIR` (see docs/benchmarks.md, 'A GPU check').",
            file=sys.stderr,
        )
        return 1
    errors = project_errors()
    if errors:
        print("gpu_check: the project does not import here:", file=sys.stderr)
        for line in errors:
            print(f"  - {line}", file=sys.stderr)
        return 1
    env = {
        "mode": args.mode,
        "commit": git_commit(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        **gpu_info(),
    }
    Path(args.json).write_text(json.dumps(env, indent=2) + "\n", encoding="utf-8")
    if args.mode == "gpu" and not env["cuda_available"]:
        print("gpu_check: torch sees no CUDA device (run with --smoke on a CPU)", file=sys.stderr)
        return 1
    return 0


# --- the random-weights model --------------------------------------------------------------


def random_model(args: argparse.Namespace) -> int:
    """A Llama model of SHAPES[shape] with random weights, saved with the tokenizer of
    --tokenizer (copied file for file, so its fingerprint is the graph's).

    The output head's rows past the tokenizer's ids and its EOS row are zero: their logits are
    0, while the rows of real tokens give random logits of either sign (a standard deviation of
    0.02 * sqrt(hidden) at this initialisation): that none of even 512 is positive has a chance
    of 2**-512. Greedy decoding then emits only ids the tokenizer knows and never stops
    early, so every answer runs to max-tokens; the model's shape, and so its cost, is
    unchanged."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    known = len(tokenizer)
    shape = SHAPES[args.shape]
    if known > shape["vocab_size"]:
        raise SystemExit(f"gpu_check: {args.tokenizer} has {known} ids, more than the model's")
    eos = tokenizer.eos_token_id
    config = LlamaConfig(**shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos)
    torch.manual_seed(args.seed)
    dtype = getattr(torch, args.dtype)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[known:] = 0
        if eos is not None:
            head[eos] = 0
    out = Path(args.out)
    model.save_pretrained(out, max_shard_size="4GB")
    for path in Path(args.tokenizer).iterdir():
        if path.is_file() and path.name.startswith(TOKENIZER_FILES):
            shutil.copy(path, out / path.name)
    figures = {
        "shape": args.shape,
        "config": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": args.dtype,
        "device": args.device,
        "tokenizer": args.tokenizer,
        "tokenizer_ids": known,
        "bytes_on_disk": sum(p.stat().st_size for p in out.iterdir() if p.is_file()),
        "seconds": round(time.perf_counter() - started, 1),
    }
    Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


# --- speculant up: ports and readiness -----------------------------------------------------


def ports(args: argparse.Namespace) -> int:
    from speculant.ports import free_ports

    print(" ".join(str(p) for p in free_ports(args.count)))
    return 0


def alive(pid: int) -> bool:
    """Whether process pid runs (a zombie, exited but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait(args: argparse.Namespace) -> int:
    """Until the gateway at --address is SERVING (0), process --pid exits or the time is up."""
    from speculant.health import wait_until_serving

    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if wait_until_serving(args.address, timeout_s=1.0):
            return 0
        if not alive(args.pid):
            print(f"gpu_check: speculant up (pid {args.pid}) exited", file=sys.stderr)
            return 1
    print(f"gpu_check: {args.address} not serving after {args.timeout:g} s", file=sys.stderr)
    return 1


# --- the summary ---------------------------------------------------------------------------


def _read(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def identity_problems(result: dict[str, Any]) -> list[str]:
    """Variants whose greedy outputs differ from hf's (or saw another tokenized prompt)."""
    problems = []
    for name, row in result["summary"].items():
        if row.get("exact_mismatches"):
            problems.append(f"{name}: {row['exact_mismatches']} of {row['prompts']} differ")
        if row.get("prompt_length_mismatches"):
            problems.append(f"{name}: {row['prompt_length_mismatches']} prompt lengths differ")
    return problems


def generate_line(result: dict[str, Any]) -> str:
    """tokens/s (total), against plain, tau and mismatches of every variant, and what each
    services variant's round costs beyond the forward more than embedded."""
    parts = []
    for name, row in result["summary"].items():
        part = f"{name} {row['tokens_per_second_total']:.0f} tok/s"
        if row["system"] not in ("hf", "plain") and row.get("speedup_over_plain_total"):
            part += f" ({row['speedup_over_plain_total']:.2f}x plain, tau {row['tau_total']:.2f})"
        if row.get("exact_mismatches"):
            part += f" [{row['exact_mismatches']} differ from hf]"
        parts.append(part)
    for name, overhead in result.get("round_overhead", {}).items():  # issue 37's bar: 1.5 ms
        parts.append(f"{name} beyond the forward +{overhead['beyond_forward_p50_ms']:.2f} ms p50")
    settings = result["settings"]
    prompts = max(row["prompts"] for row in result["summary"].values())
    where = f"{prompts} prompts, {settings['device']}, {settings.get('dtype', 'auto')}"
    return f"{where}: " + "; ".join(parts)


def cost_line(result: dict[str, Any]) -> str:
    cost = result["cost"]
    parts = []
    for model in cost["models"]:
        forward = model["forward"]
        counts = sorted(int(n) for n in forward)
        one = forward[str(counts[0])]["median_ms"]
        last = counts[-1]
        parts.append(
            f"{model['name']} cost(1) {one:.2f} ms, cost({last}) "
            f"{forward[str(last)]['relative']:.2f}x"
        )
    return f"{cost['device_name']}, {cost['dtype']}: " + "; ".join(parts)


def load_line(results: list[dict[str, Any]]) -> tuple[str, list[str]]:
    parts, problems = [], []
    for r in results:
        ttft, itl = r["ttft_ms"]["p50"], r["itl_ms"]["p50"]
        parts.append(
            f"c={r['concurrency']} {r['tokens_per_second']:.0f} tok/s, {r['requests']} requests, "
            f"TTFT p50 {ttft or 0:.1f} ms, ITL p50 {itl or 0:.2f} ms"
        )
        if r["errors"] or not r["requests"]:
            problems.append(f"c={r['concurrency']}: errors {r['errors']}, {r['requests']} requests")
    return "; ".join(parts), problems


def draft_line(results: list[dict[str, Any]]) -> str:
    """Each draft's in-process median and p50 over a gRPC stream (bench draft)."""
    parts = []
    for r in results:
        params = r["params"]
        shape = f"tree of {params['tree_nodes']}," if params["tree_nodes"] else "chain of"
        stream = next(g["p50_ms"] for g in r["grpc"] if g["rpc"] == "stream")
        parts.append(
            f"{shape} k {params['k']}: {r['in_process']['median_us']:.0f} us in process, "
            f"{stream:.2f} ms over a stream (p50)"
        )
    return "; ".join(parts)


def describe(kind: str, files: list[str]) -> tuple[str, list[str]]:
    """(the step's line, its problems) from its JSON files."""
    if kind == "env":
        env = _read(files[0])
        where = env.get("device_name") or f"CPU only ({env['cpu_count']} cores)"
        torch = env["versions"].get("torch")
        return f"{where}, torch {torch}, python {env['python']}, commit {env['commit']}", []
    if kind == "build":
        builds = [_read(f) for f in files]
        return "; ".join(
            f"{b['tokenizer']}: {b['tokens']:,} tokens in {b['wall_seconds']:.1f} s" for b in builds
        ), []
    if kind == "model":
        m = _read(files[0])
        return (
            f"{m['shape']}: {m['parameters'] / 1e9:.3f}B parameters, {m['dtype']}, "
            f"{m['bytes_on_disk'] / 2**30:.2f} GiB, {m['seconds']:.0f} s"
        ), []
    if kind == "cost":
        return cost_line(_read(files[0])), []
    if kind == "draft":
        return draft_line([_read(f) for f in files]), []
    if kind in ("identity", "generate"):
        result = _read(files[0])
        problems = identity_problems(result) if kind == "identity" else []
        return generate_line(result), problems
    if kind == "load":
        return load_line([_read(f) for f in files])
    if kind == "batching":  # trees, then chains, at the same concurrency
        trees, chains = (_read(f) for f in files)
        line, problems = load_line([trees, chains])
        ratio = trees["tokens_per_second"] / max(chains["tokens_per_second"], 1e-9)
        return f"trees / chains {ratio:.2f}x: {line.replace('; ', ' against ')}", problems
    raise ValueError(f"unknown kind {kind!r}")


def report(args: argparse.Namespace) -> int:
    """One line for a step (and a record in steps.jsonl); 1 when the step failed."""
    out = Path(args.out)
    record: dict[str, Any] = {"step": args.step, "seconds": args.seconds, "files": []}
    problems: list[str] = []
    if args.skip:
        record.update(status="skip", line=args.skip)
    elif args.rc != 0:
        record.update(status="FAIL", line=f"exit status {args.rc}; log: {args.log}")
    else:
        try:
            line, problems = describe(args.kind, args.files)
            record.update(status="FAIL" if problems else "ok", line=line, problems=problems)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            record.update(status="FAIL", line=f"its output does not read: {exc!r}")
        record["files"] = [os.path.relpath(f, out) for f in args.files]
    print(f"[{record['status']}] {args.step} ({args.seconds:.0f} s): {record['line']}", flush=True)
    for problem in problems:
        print(f"    {problem}", flush=True)
    if record["status"] == "FAIL" and args.log and Path(args.log).is_file():
        tail = Path(args.log).read_text(errors="replace").splitlines()[-15:]
        print("\n".join(f"    | {line}" for line in tail), flush=True)
    with open(out / "steps.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    return 1 if record["status"] == "FAIL" else 0


def finish(args: argparse.Namespace) -> int:
    """summary.json from steps.jsonl; 1 when a step failed."""
    out = Path(args.out)
    path = out / "steps.jsonl"
    steps = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    failed = [s["step"] for s in steps if s["status"] == "FAIL"]
    summary = {
        "mode": args.mode,
        "passed": not failed and not args.interrupted,
        "interrupted": args.interrupted,
        "failed": failed,
        "skipped": [s["step"] for s in steps if s["status"] == "skip"],
        "seconds": args.seconds,
        "steps": steps,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    verdict = f"FAILED: {', '.join(failed)}" if failed else "passed"
    if args.interrupted:
        verdict = "interrupted" + (f"; {verdict}" if failed else "")
    print(f"gpu_check {args.mode}: {len(steps)} steps in {args.seconds:.0f} s, {verdict}")
    return 0 if summary["passed"] else 1


def add_report_commands(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("--step", required=True)
    p.add_argument("--kind", default="")
    p.add_argument("--rc", type=int, default=0)
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--log", default="")
    p.add_argument("--skip", default="", help="the reason the step did not run")
    p.add_argument("files", nargs="*")
    p.set_defaults(handler=report)
    p = commands.add_parser("finish")
    p.add_argument("--out", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--interrupted", action="store_true", help="the run was stopped (SIGTERM)")
    p.set_defaults(handler=finish)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("preflight")
    p.add_argument("--mode", choices=["gpu", "smoke"], required=True)
    p.add_argument("--json", required=True)
    p.set_defaults(handler=preflight)
    p = commands.add_parser("random-model")
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", required=True)
    p.set_defaults(handler=random_model)
    p = commands.add_parser("ports")
    p.add_argument("count", type=int)
    p.set_defaults(handler=ports)
    p = commands.add_parser("wait")
    p.add_argument("--address", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600.0)
    p.set_defaults(handler=wait)
    add_report_commands(commands)
    parsed = parser.parse_args()
    sys.exit(parsed.handler(parsed))
