"""The handlers of ``speculant graph-info`` and ``speculant graph-viz`` (registered by
:mod:`builder.cli`): a graph's meta and statistics, and an HTML page drawing part of a graph.

They import the graph reader, the tokenizer and the page renderer only when they run.
"""

from __future__ import annotations

import argparse
import json


def run_graph_info(args: argparse.Namespace) -> int:
    from builder.info import format_info, graph_info
    from speculant.cli_errors import fail
    from speculant.graph_format import GraphFormatError

    try:
        info = graph_info(args.graph)
    except GraphFormatError as exc:
        return fail(exc)
    print(json.dumps(info, indent=2, sort_keys=True) if args.json else format_info(info))
    return 0


def run_graph_viz(args: argparse.Namespace) -> int:
    from pathlib import Path

    from builder.graph_viz import VizError, select_subgraph
    from builder.graph_viz_page import render_html
    from speculant.cli_errors import fail
    from speculant.graph_format import GraphFormatError
    from speculant.graph_reader import NGramGraph
    from speculant.tokenizer import TokenizerLoadError

    try:
        with NGramGraph.open(args.graph) as graph:
            labels, tokenizer = _viz_labels(graph.meta, args)
            context_ids = None if tokenizer is None else list(tokenizer(args.context).input_ids)
            viz = select_subgraph(
                graph,
                labels,
                context_ids=context_ids,
                max_nodes=args.max_nodes,
                min_weight=args.min_weight,
            )
            viz.context_text = args.context
            meta = graph.meta
        page = render_html(
            viz,
            title=f"n-gram graph {Path(args.graph).resolve().name}",
            subtitle=f"{meta.tokenizer_name}, orders 1..{meta.max_order}, "
            f"{meta.corpus_tokens:,} corpus tokens",
        )
        Path(args.out).write_text(page, encoding="utf-8")
    except (GraphFormatError, TokenizerLoadError, VizError, ValueError, OSError) as exc:
        return fail(exc)
    contexts = sum(1 for n in viz.nodes if n.kind == "context")
    print(
        f"wrote {args.out}: {len(viz.nodes)} nodes ({contexts} contexts, "
        f"{len(viz.nodes) - contexts} tokens), {len(viz.edges)} edges"
        + (" (cut at --max-nodes)" if viz.truncated else "")
    )
    return 0


def _viz_labels(meta, args: argparse.Namespace):
    """(labels, tokenizer): the graph's tokenizer, checked against its fingerprint.

    The tokenizer is returned only when --context needs it. Without --tokenizer and --context a
    tokenizer that does not load (a hub name offline) only costs the labels: they show ids.
    """
    from builder.graph_viz import id_labels, tokenizer_labels
    from speculant.tokenizer import TokenizerLoadError, load_tokenizer, tokenizer_fingerprint

    name = args.tokenizer or meta.tokenizer_name
    try:
        tokenizer = load_tokenizer(name)
    except TokenizerLoadError as exc:
        if args.tokenizer or args.context is not None:
            raise
        from speculant.cli_errors import warn

        warn(f"{exc}; the page shows token ids (give --tokenizer)")
        return id_labels(), None
    if tokenizer_fingerprint(tokenizer) != meta.tokenizer_fingerprint:
        raise ValueError(
            f"tokenizer {name} is not the one the graph was built with "
            f"({meta.tokenizer_name}, fingerprint {meta.tokenizer_fingerprint})"
        )
    return tokenizer_labels(tokenizer), tokenizer if args.context is not None else None
