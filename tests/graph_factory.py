"""Hand-made n-gram graphs for tests, in format 1 of speculant.graph_format (per-order LMDB
tables, which the reader still reads): any counts, not only a corpus's.

``chains`` maps an order o to {context (o token ids): {successor id: count}}; the meta record is
written last, in its own transaction, as the builder does.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import lmdb
import numpy as np

from speculant.graph_format import (
    MAX_SUPPORTED_ORDER,
    META_DB,
    META_KEY,
    TABLES_FORMAT,
    GraphFormatError,
    GraphMeta,
    OrderStats,
    encode_context,
    encode_successors,
    order_db_name,
)
from speculant.graph_manifest import DATA_FILE, write_manifest
from speculant.graph_reader import NGramGraph

Chains = dict[int, dict[tuple[int, ...], dict[int, int]]]


def _write_order(env: lmdb.Environment, order: int, chain: dict) -> OrderStats:
    """Write one order's contexts and successors (most frequent first) to its database."""
    db = env.open_db(order_db_name(order))
    with env.begin(write=True, db=db) as txn:
        for context in sorted(chain):
            assert len(context) == order, f"context {context} is not of order {order}"
            items = sorted(chain[context].items(), key=lambda kv: (-kv[1], kv[0]))
            ids = np.array([i for i, _ in items])
            counts = np.array([c for _, c in items])
            txn.put(encode_context(list(context)), encode_successors(ids, counts))
    return OrderStats(
        order=order,
        contexts=len(chain),
        ngrams=sum(len(s) for s in chain.values()),
        total_count=sum(sum(s.values()) for s in chain.values()),
    )


def _write_meta(env: lmdb.Environment, meta: GraphMeta) -> None:
    """Write the meta record, in its own transaction (last, as the builder does)."""
    meta_db = env.open_db(META_DB)
    with env.begin(write=True, db=meta_db) as txn:
        txn.put(META_KEY, meta.to_json())


def write_graph(
    path: str | Path,
    chains: Chains,
    *,
    tokenizer_name: str = "test-tokenizer",
    fingerprint: str = "test-fingerprint",
    vocab_size: int = 100,
    max_order: int | None = None,
    format_version: int = TABLES_FORMAT,
    write_meta: bool = True,
    version: int = 1,
    manifest: bool = True,
) -> Path:
    """Write a graph directory at path and return it.

    max_order defaults to the highest order in chains; every order 1..max_order gets a database
    (possibly empty). write_meta=False leaves an unfinished graph. version: the meta's graph
    version. manifest: write the checksum manifest, as the builder does.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if max_order is None:
        max_order = max(chains, default=1)
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=MAX_SUPPORTED_ORDER + 2, subdir=True)
    try:
        orders = [
            _write_order(env, order, chains.get(order, {})) for order in range(1, max_order + 1)
        ]
        if write_meta:
            meta = GraphMeta(
                format_version=format_version,
                max_order=max_order,
                tokenizer_name=tokenizer_name,
                tokenizer_fingerprint=fingerprint,
                vocab_size=vocab_size,
                corpus_documents=1,
                corpus_tokens=orders[0].total_count if orders else 0,
                orders=orders,
                build_params={"source": "tests/graph_factory.py"},
                built_at=datetime.now(UTC).isoformat(),
                version=version,
            )
            _write_meta(env, meta)
    finally:
        env.close()
    assert (path / DATA_FILE).is_file()
    if manifest:
        write_manifest(path)
    return path


def is_closed(graph: NGramGraph) -> bool:
    """Whether the graph was closed: a lookup on it is refused."""
    try:
        graph.successors([1])
    except GraphFormatError as exc:
        assert "is closed" in str(exc), exc
        return True
    return False
