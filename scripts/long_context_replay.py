"""tau (tokens per verifier forward, over all tokens) of the default drafts with and without long
context, by greedy replay (distill/replay.py: every drafted token verified, a flat cost, as
`speculant tune` scores) against the model's greedy continuations of the prompts.

    .venv/bin/python scripts/long_context_replay.py GRAPH MODEL PROMPTS.jsonl \\
        [--limit 48] [--windows 0,16] [--longest-from 8] [--traces traces.json]

--traces keeps the continuations (the slow part: minutes for SmolLM2 on a CPU) for later runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from distill.replay import GreedyTrace, prompt_traces, simulate_all, verify_all
from draft_service.drafting import Drafter
from speculant import graph_reader
from speculant.config import DraftConfig, DraftParams, VerifierConfig
from speculant.prompt_records import load_prompts


def traces(args: argparse.Namespace) -> tuple[list[GreedyTrace], list[str]]:
    """The prompts' greedy continuations and kinds (read from --traces when it exists)."""
    if args.traces and Path(args.traces).exists():
        data = json.loads(Path(args.traces).read_text())[: args.limit]
    else:
        from verifier_service.model import LoadedModel

        loaded = LoadedModel.load(VerifierConfig(model_name=args.model, device="cpu"))
        records = load_prompts(args.prompts, args.limit)
        found = prompt_traces(loaded, records, args.max_tokens)
        data = [
            {"p": list(t.prompt_ids), "t": list(t.tokens), "e": t.ended_by_eos, "kind": r.kind}
            for t, r in zip(found, records, strict=True)
        ]
        if args.traces:
            Path(args.traces).write_text(json.dumps(data))
    found = [GreedyTrace(tuple(d["p"]), tuple(d["t"]), d["e"]) for d in data]
    return found, [d.get("kind") or "all" for d in data]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph")
    parser.add_argument("model")
    parser.add_argument("prompts")
    parser.add_argument("--limit", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--windows", default="0,16", help="long-context windows (0: off)")
    parser.add_argument("--longest-from", type=int, default=graph_reader.LONGEST_FROM)
    parser.add_argument("--traces", help="a file that keeps the greedy continuations")
    args = parser.parse_args()
    found, kinds = traces(args)
    graph_reader.LONGEST_FROM = args.longest_from
    params = verify_all(DraftParams.from_config(DraftConfig()))
    for window in (int(w) for w in args.windows.split(",")):
        with graph_reader.NGramGraph.open(args.graph) as graph:
            graph.use_long_context(window)
            drafter = Drafter(graph)
            tau = {}
            for kind in [*sorted(set(kinds)), "all"]:
                chosen = [t for t, k in zip(found, kinds, strict=True) if kind in ("all", k)]
                result = simulate_all(drafter, params, chosen, args.max_tokens, graph.window)
                tau[kind] = round(result.tokens / result.forwards, 3)
        print(json.dumps({"window": window, "longest_from": args.longest_from, "tau": tau}))


if __name__ == "__main__":
    main()
