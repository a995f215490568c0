"""`speculant demo`: build a graph from the demo corpus, then generate with speculative decoding
(embedded) and with plain decoding of the same model, side by side, and print the figures."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from speculant.config import DEFAULT_DRAFT_K

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "demo"


def register_demo(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="build the demo graph and compare speculative with plain decoding"
    )
    demo.add_argument(
        "--corpus", default=str(DEMO / "tinystories-slice.txt"), help="corpus of the graph"
    )
    demo.add_argument("--doc-separator", default="\n\n\n", help="splits the corpus into documents")
    demo.add_argument("--model", default=str(DEMO / "stories260K"), help="the target model")
    demo.add_argument(
        "--prompts", default=str(DEMO / "prompts.jsonl"), help="JSON lines with `prompt`"
    )
    demo.add_argument(
        "--graph", default=str(ROOT / "graphs" / "demo"), help="where the graph is built"
    )
    demo.add_argument("--rebuild", action="store_true", help="rebuild the graph even if present")
    demo.add_argument("--max-tokens", type=int, default=128, help="tokens per prompt")
    demo.add_argument("--k", type=int, default=DEFAULT_DRAFT_K, help="draft tokens per round")
    demo.add_argument(
        "--no-attentive-mix",
        dest="attentive_mix",
        action="store_false",
        help="draft from the highest matching order only",
    )
    demo.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads for both decoders (the demo model is tiny: 1 is fastest)",
    )
    demo.set_defaults(handler=run_demo)


def _load_prompts(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def run_demo(args: argparse.Namespace) -> int:
    import torch

    from gateway import DraftConfig, GenerationConfig, SpeculativeDecoder, VerifierConfig
    from gateway.launch.baseline import PlainDecoder

    torch.set_num_threads(args.torch_threads)
    graph = _graph(args)
    print(f"2. loading {args.model} (embedded verifier) and the graph", file=sys.stderr)
    decoder = SpeculativeDecoder(
        graph_path=graph,
        verifier_config=VerifierConfig(model_name=args.model),
        draft_config=DraftConfig(k=args.k, strategy="greedy", attentive_mix=args.attentive_mix),
    )
    plain = PlainDecoder.load(args.model, decoder.verifier.info.eos_token_ids)
    generation = GenerationConfig(max_tokens=args.max_tokens, temperature=0.0)
    prompts = _load_prompts(args.prompts)

    # Warm up both paths, then alternate them prompt by prompt so both see the same machine.
    decoder.generate(prompt=prompts[0], generation_config=generation)
    plain.generate(decoder.tokenizer(prompts[0]).input_ids, args.max_tokens)
    print(
        f"3. generating {args.max_tokens} tokens at temperature 0 for {len(prompts)} prompts, "
        "speculative and plain (Hugging Face generate), alternately",
        file=sys.stderr,
    )
    speedups, rates, taus, identical = [], [], [], 0
    for i, prompt in enumerate(prompts):
        spec = decoder.generate(prompt=prompt, generation_config=generation)
        base = plain.generate(decoder.tokenizer(prompt).input_ids, args.max_tokens)
        spec_tps = spec.stats.generated_tokens / spec.stats.total_seconds
        base_tps = len(base.token_ids) / base.seconds
        speedups.append(spec_tps / base_tps)
        rates.append(spec.acceptance_rate)
        taus.append(spec.stats.tokens_per_round)
        identical += spec.token_ids == base.token_ids
        if i == 0:
            print(f"\nPrompt: {prompt}\nSpeculative output: {spec.text}\n")
        print(
            f"  prompt {i + 1}: {spec_tps:6.0f} tok/s speculative vs {base_tps:6.0f} HF generate "
            f"({speedups[-1]:.2f}x), acceptance {spec.acceptance_rate:.0%}, "
            f"{spec.stats.tokens_per_round:.2f} tokens/verifier call"
        )
    print(
        f"\nSummary over {len(prompts)} prompts (medians): acceptance rate "
        f"{statistics.median(rates):.1%}, {statistics.median(taus):.2f} tokens per verifier call, "
        f"speedup over plain decoding (Hugging Face generate) {statistics.median(speedups):.2f}x"
        " (speculation plus the verifier's lean forward: `speculant bench generate` separates"
        " them); "
        f"outputs identical to plain greedy decoding: {identical}/{len(prompts)}"
    )
    return 0 if identical == len(prompts) else 1


def _graph(args: argparse.Namespace) -> Path:
    """The demo's graph: built from --corpus unless it exists (or with --rebuild)."""
    from builder import GraphBuilder

    graph = Path(args.graph)
    if args.rebuild or not graph.exists():
        print(f"1. building the n-gram graph of {args.corpus} -> {graph}", file=sys.stderr)
        started = time.perf_counter()
        builder = GraphBuilder(tokenizer_name=args.model, max_order=5)
        builder.build_from_files([args.corpus], doc_separator=args.doc_separator)
        builder.save(graph)
        print(f"   built in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    else:
        print(f"1. using the graph at {graph} (--rebuild to rebuild it)", file=sys.stderr)
    return graph
