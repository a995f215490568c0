"""Reading a published graph's meta and statistics (for ``speculant graph-info``)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import lmdb

from speculant.graph_format import (
    TABLES_FORMAT,
    GraphFormatError,
    open_graph_env,
    order_db_name,
    read_meta,
    resident_bytes,
)
from speculant.graph_reader import folder_bytes


def disk_usage(path: Path) -> int:
    """Bytes the directory's files occupy on disk (allocated blocks)."""
    return sum(f.stat().st_blocks * 512 for f in path.iterdir() if f.is_file())


def graph_info(path: str | Path) -> dict[str, Any]:
    """The meta record plus size on disk and bytes per corpus token; a format 1 graph's entry
    count per order is checked against the meta.

    Raises GraphFormatError for a missing, unfinished or corrupt graph.
    """
    path = Path(path)
    env = open_graph_env(path)
    try:
        meta = read_meta(env, path)
        for stats in meta.orders if meta.format_version == TABLES_FORMAT else ():
            try:
                db = env.open_db(order_db_name(stats.order), create=False)
                entries = _entries(env, db)
            except lmdb.Error as exc:
                raise GraphFormatError(
                    f"corrupt graph {path}: order {stats.order} unreadable ({exc})"
                ) from exc
            if entries != stats.contexts:
                raise GraphFormatError(
                    f"corrupt graph {path}: order {stats.order} has {entries} contexts, "
                    f"the meta says {stats.contexts}"
                )
        damage = env.mapped.damage()  # the file shrank or changed while it was read
        if damage is not None:
            raise GraphFormatError(f"graph {path} changed while it was read: {damage}")
        resident = resident_bytes(env.mapped.regions)
    finally:
        env.close()
    info = asdict(meta)
    info["path"] = str(path.resolve())
    info["size_on_disk_bytes"] = disk_usage(path)
    info["size_bytes"] = folder_bytes(path)
    info["bytes_per_token"] = round(info["size_on_disk_bytes"] / max(1, meta.corpus_tokens), 2)
    # of its data file, in the host's page cache now: what every process mapping it shares
    info["resident_bytes"] = resident
    return info


def distilled_line(record: dict[str, Any]) -> str:
    """One line describing a ``speculant distill`` run (a source record's ``distilled``)."""
    source = record.get("prompt_source", {})
    corpus = " ".join(source.get("corpus", []))
    if "prompts_file" in source:
        prompts = f"prompts from {source['prompts_file']}"
    elif source.get("type") == "passages":
        words = source.get("passage_words", ["?", "?"])
        templates = ", ".join(source.get("templates", {}))
        prompts = f"prompts: {words[0]}-{words[1]} word passages of {corpus} ({templates})"
    else:
        words = source.get("prefix_words", ["?", "?"])
        prompts = f"prompts: {words[0]}-{words[1]} word prefixes of {corpus}"
    extra = ""
    if samples := record.get("samples"):
        extra += (
            f", {samples.get('generations', 0):,} of them sampled ({samples.get('per_prompt')} "
            f"a prompt at temperature {samples.get('temperature')}, weight {samples.get('weight')})"
        )
    if cut := record.get("loop_cut"):
        extra += (
            f", loops cut ({cut.get('ngram')}-grams past {cut.get('repeats')}: "
            f"{cut.get('tokens', 0):,} tokens of {cut.get('answers', 0):,} answers)"
        )
    return (
        f"distilled: {record.get('generations', 0):,} continuations of up to "
        f"{record.get('max_tokens', '?')} tokens ({record.get('tokens', 0):,} tokens, weight "
        f"{record.get('weight', 1)}) by {record.get('model', '?')} "
        f"({str(record.get('model_fingerprint', '?'))[:23]}...) at temperature "
        f"{record.get('temperature', '?')}{', chat' if record.get('chat') else ''}{extra}; "
        f"{prompts}"
    )


def _entries(env: lmdb.Environment, db) -> int:
    with env.begin(db=db) as txn:
        return int(txn.stat(db)["entries"])


def format_info(info: dict[str, Any]) -> str:
    """Human-readable graph-info text."""
    params = info.get("build_params", {})
    lines = [
        f"graph:          {info['path']}",
        f"format version: {info['format_version']}",
        f"tokenizer:      {info['tokenizer_name']}",
        f"fingerprint:    {info['tokenizer_fingerprint']}",
        f"vocab size:     {info['vocab_size']:,}",
        f"max order:      {info['max_order']}",
        f"corpus:         {info['corpus_documents']:,} documents, {info['corpus_tokens']:,} tokens",
        f"version:        {info.get('version', 1)}",
        f"built at:       {info['built_at']} in {info['build_seconds']:.1f} s",
        f"inputs:         {' '.join(params.get('inputs', []))}",
        f"doc separator:  {params.get('doc_separator')!r}   text field: "
        f"{params.get('text_field')!r}",
        f"size on disk:   {info['size_on_disk_bytes'] / 2**20:,.1f} MiB "
        f"({info['size_bytes']:,} bytes, {info['bytes_per_token']:.1f} bytes a corpus token)",
        f"resident:       {info.get('resident_bytes', 0) / 2**20:,.1f} MiB in the page cache "
        "(shared by every process that maps the graph)",
    ]
    index = info.get("index") or {}
    if index:  # format 2: the suffix index
        lines.append(
            f"index:          contexts of up to {index.get('max_context', '?')} tokens; "
            f"{index.get('entries', 0):,} positions, {index.get('table_ranges', 0):,} tabled "
            f"ranges (>= {index.get('frequent_min', '?')} positions)"
            + (", weighted" if index.get("weighted") else "")
        )
    sources = info.get("sources") or []
    if len(sources) > 1:  # an appended graph: what each version added
        lines.append("sources:")
        for src in sources:
            lines.append(
                f"  v{src['version']}: {src['documents']:,} documents, {src['tokens']:,} tokens "
                f"from {' '.join(src['inputs'])} ({src['built_at']})"
            )
            lines += [f"      {distilled_line(d)}" for d in src.get("distilled", [])]
    tuned = info.get("tuned") or {}
    if tuned.get("params"):
        values = " ".join(f"{k}={v}" for k, v in sorted(tuned["params"].items()))
        lines.append(f"tuned drafting: {values} (speculant tune, {tuned.get('tuned_at', '?')})")
    lines += ["", f"{'order':>5} {'contexts':>12} {'n-grams':>12} {'total count':>13}"]
    for o in info["orders"]:
        lines.append(
            f"{o['order']:>5} {o['contexts']:>12,} {o['ngrams']:>12,} {o['total_count']:>13,}"
        )
    return "\n".join(lines)
