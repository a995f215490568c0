"""Tau per domain in a deployment of several graphs: each domain's prompts with its own graph
alone (a deployment serving that graph only), with the right graph picked per request in one
deployment of every graph (the catalog), with one graph of every corpus (all searched), and with
no graph (the request's own context). Greedy; outputs are checked identical across the rows.

    .venv/bin/python scripts/catalog_tau.py --model ../shared/models/smollm2-135m-instruct \\
        --graph docs=graphs/docs --graph code=graphs/stdlib --all-graph graphs/both \\
        --prompts docs=docs_prompts.jsonl --prompts code=code_prompts.jsonl \\
        --max-tokens 128 --verify-cost flat --json catalog-tau.json

The three services run in this process on free localhost ports (a new draft service and gateway
per row, one verifier for all), with learning in memory only, so no learn log is written beside
a graph. tau = generated tokens / verifier forwards, over all of a domain's tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from draft_service.learning import LearningConfig
from draft_service.server import start_server as start_draft
from gateway.api.server import start_gateway
from speculant.client import SpeculantClient
from speculant.config import VerifierConfig
from speculant.graph_catalog import parse_graph_specs
from speculant.prompt_records import load_prompts
from verifier_service.server import start_server as start_verifier


def run_row(verifier: str, graphs: list[str], prompts, graph_of, args) -> dict:
    """Generate every domain's prompts on a new draft service of `graphs` and a new gateway;
    graph_of(domain) names the graph each request drafts from. Returns per domain: tau, tokens,
    rounds, seconds, and the outputs."""
    learning = None if args.no_learn else LearningConfig(log_path=None)
    draft = start_draft(graphs, port=0, learning=learning, reload_interval_s=0, catalog_file=None)
    gateway, _ = start_gateway(
        [draft.address], verifier, port=0, draft_timeout_s=30, verify_cost=args.verify_cost
    )
    out = {}
    try:
        with SpeculantClient(gateway.address, timeout_s=600) as client:
            for domain, records in prompts.items():
                tokens = rounds = 0
                outputs = []
                started = time.perf_counter()
                for record in records:
                    messages = [{"role": r, "content": c} for r, c in record.messages]
                    answer = client.generate(
                        record.text,
                        messages=messages or None,
                        max_tokens=args.max_tokens,
                        temperature=0,
                        graph=graph_of(domain),
                    )
                    tokens += answer.stats.generated_tokens
                    rounds += answer.stats.rounds
                    outputs.append(list(answer.token_ids))
                out[domain] = {
                    "tau": tokens / max(1, rounds),
                    "tokens": tokens,
                    "rounds": rounds,
                    "seconds": time.perf_counter() - started,
                    "outputs": outputs,
                }
    finally:
        gateway.stop(0)
        draft.stop(0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--graph", action="append", required=True, metavar="DOMAIN=DIR")
    parser.add_argument("--all-graph", default=None, help="one graph of every domain's corpus")
    parser.add_argument("--prompts", action="append", required=True, metavar="DOMAIN=FILE")
    parser.add_argument("--limit", type=int, default=None, help="prompts per domain at most")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--verify-cost", default="flat")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--no-learn", action="store_true", help="draft services do not learn")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    specs, _ = parse_graph_specs(args.graph)
    prompts = {}
    for entry in args.prompts:
        domain, _, path = entry.partition("=")
        prompts[domain] = load_prompts(path, args.limit)
    if set(prompts) != {spec.name for spec in specs}:
        parser.error("give one --graph and one --prompts per domain, with the same names")
    config = VerifierConfig(model_name=args.model, device="cpu", torch_threads=args.torch_threads)
    verifier, local = start_verifier(config, port=0)
    rows: dict[str, dict] = {}
    try:
        for spec in specs:  # each domain with its graph alone
            alone = run_row(
                verifier.address,
                [str(spec.path)],
                {spec.name: prompts[spec.name]},
                lambda _domain: "",
                args,
            )
            rows.setdefault("alone", {}).update(alone)
        everything = [f"{spec.name}={spec.path}" for spec in specs]
        rows["catalog"] = run_row(verifier.address, everything, prompts, lambda d: d, args)
        if args.all_graph:
            rows["all"] = run_row(verifier.address, [args.all_graph], prompts, lambda _d: "", args)
        rows["none"] = run_row(verifier.address, everything, prompts, lambda _d: "none", args)
    finally:
        verifier.stop(0)
        local.close()
    identical = all(
        rows[row][domain]["outputs"] == rows["alone"][domain]["outputs"]
        for row in rows
        for domain in prompts
    )
    print(f"{'row':<8}" + "".join(f"{d:>12}" for d in prompts))
    for row, figures in rows.items():
        print(f"{row:<8}" + "".join(f"{figures[d]['tau']:>12.3f}" for d in prompts))
    print(f"outputs identical across rows: {identical}")
    if args.json:
        report = {
            "model": args.model,
            "graphs": {spec.name: str(spec.path) for spec in specs},
            "all_graph": args.all_graph,
            "max_tokens": args.max_tokens,
            "verify_cost": args.verify_cost,
            "learn": not args.no_learn,
            "prompts": {d: len(p) for d, p in prompts.items()},
            "identical_outputs": identical,
            "tau": {
                row: {d: f["tau"] for d, f in figures.items()} for row, figures in rows.items()
            },
            "rows": {
                row: {d: {k: v for k, v in f.items() if k != "outputs"} for d, f in figures.items()}
                for row, figures in rows.items()
            },
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
