"""``speculant bench distill``: tau on held-out prompts against the distillation budget.

The model's continuations of max(budgets) prompts are generated once; for each budget b a copy
of the graph gets the first b of them (in prompt order) appended, as ``speculant distill
--generations b`` would, and the embedded decoder generates greedily on the held-out prompts
with the default draft settings and learning off (tau of the graph alone). tau = generated
tokens / verifier forward passes (the prefill included), per prompt; the table reports its
median over prompts and its value over all tokens, and the acceptance rate. A user picks a
budget from the curve: the time it costs against the tau it buys (tau is what carries to a
GPU: the draft is free there, the forward is not).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.settings import DEMO_PROMPTS, SHARED_DEV_PROMPTS
from distill.generation import Generation
from distill.run import append_generations, continuations, prepare


def eval_prompts(path: str | None, limit: int | None) -> tuple[Path, list[str]]:
    """The held-out prompts: the file given, else the tinystories dev prompts, else the demo's."""
    chosen = Path(path) if path else SHARED_DEV_PROMPTS
    if not path and not chosen.is_file():
        chosen = DEMO_PROMPTS
    with chosen.open(encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    return chosen, prompts[:limit] if limit else prompts


def measure_tau(graph: Path, model_name: str, prompts: list[str], max_tokens: int) -> dict:
    """Greedy generation on the prompts with the default drafts from the graph alone: tau and
    acceptance."""
    from gateway import GenerationConfig, SpeculativeDecoder, VerifierConfig

    # learn=False: tau of the graph alone (a learning decoder would also draft from the
    # earlier evaluation prompts' outputs)
    decoder = SpeculativeDecoder(
        graph, VerifierConfig(model_name=model_name, device="cpu"), learn=False
    )
    taus, tokens, rounds, drafted, accepted = [], 0, 0, 0, 0
    started = time.perf_counter()
    for prompt in prompts:
        result = decoder.generate(
            prompt, generation_config=GenerationConfig(max_tokens=max_tokens, temperature=0)
        )
        stats = result.stats
        taus.append(len(result.token_ids) / stats.rounds)
        tokens, rounds = tokens + len(result.token_ids), rounds + stats.rounds
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted_tokens
    return {
        "tau_median": statistics.median(taus),
        "tau_all_tokens": tokens / rounds,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "tokens": tokens,
        "rounds": rounds,
        "seconds": time.perf_counter() - started,
    }


def run_bench(args: argparse.Namespace) -> int:
    from distill.cli import options_from_args

    budgets = args.budgets
    options = options_from_args(args, max(max(budgets), 1))
    prompts_path, prompts = eval_prompts(args.eval_prompts, args.limit)
    job = prepare(options)
    started = time.perf_counter()
    generations: list[Generation] = sorted(continuations(job), key=lambda g: g.index)
    generate_seconds = time.perf_counter() - started
    per_generation = generate_seconds / max(len(generations), 1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-distill-") as scratch:
        for budget in budgets:
            graph = job.graph
            if budget > 0:
                graph = Path(scratch) / f"graph-{budget}"
                shutil.copytree(job.graph, graph)
                append_generations(job, generations[:budget], graph)
            row = {"generations": budget, "est_generate_seconds": budget * per_generation}
            row |= measure_tau(graph, args.model, prompts, args.eval_max_tokens)
            rows.append(row)
            _progress(f"budget {budget}: tau {row['tau_median']:.2f} (median)")
            if graph != job.graph:
                shutil.rmtree(graph, ignore_errors=True)
    base = rows[0]["tau_all_tokens"] if rows and rows[0]["generations"] == 0 else None
    result = {
        "graph": str(job.graph),
        "model": args.model,
        "eval_prompts": str(prompts_path),
        "prompts": len(prompts),
        "eval_max_tokens": args.eval_max_tokens,
        "max_tokens": options.max_tokens,
        "temperature": options.temperature,
        "weight": options.weight,
        "device": str(job.loaded.device),
        "generate_seconds": generate_seconds,
        "generations_per_second": len(generations) / max(generate_seconds, 1e-9),
        "rows": rows,
    }
    print(format_table(result, base))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    if args.plot:
        plot(result, args.plot)
    return 0


def format_table(result: dict[str, Any], base: float | None) -> str:
    lines = [
        f"tau on {result['prompts']} evaluation prompts ({result['eval_prompts']}), "
        f"{result['eval_max_tokens']} tokens, greedy, default drafts; distilled with "
        f"{result['model']} at temperature {result['temperature']}, weight {result['weight']}, "
        f"{result['generations_per_second']:.1f} generations/s on {result['device']}",
        f"{'generations':>11} {'tau median':>10} {'tau all':>8} {'vs 0':>6} {'accept':>7} "
        f"{'~seconds':>9}",
    ]
    for row in result["rows"]:
        ratio = f"{row['tau_all_tokens'] / base:.2f}x" if base else "-"
        lines.append(
            f"{row['generations']:>11,} {row['tau_median']:>10.2f} {row['tau_all_tokens']:>8.2f} "
            f"{ratio:>6} {row['acceptance_rate']:>7.1%} {row['est_generate_seconds']:>9.1f}"
        )
    return "\n".join(lines)


def plot(result: dict[str, Any], out: str) -> None:
    """tau against the number of distilled generations (matplotlib, Agg)."""
    from bench.plot import require_matplotlib

    plt = require_matplotlib()
    rows = result["rows"]
    xs = [r["generations"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, [r["tau_median"] for r in rows], marker="o", label="median over prompts")
    ax.plot(xs, [r["tau_all_tokens"] for r in rows], marker="s", label="over all tokens")
    ax.set_xlabel("distilled generations")
    ax.set_ylabel("tokens per verifier forward (tau)")
    ax.set_title(f"speculant distill: {Path(result['graph']).name}, {result['prompts']} prompts")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
