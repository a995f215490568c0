"""Graph comparison for tests: two graphs hold the same LMDB entries and corpus figures."""

from __future__ import annotations

from pathlib import Path

from speculant.graph_format import open_graph_env, order_db_name, read_meta


def graph_entries(path: Path) -> tuple[dict[int, list[tuple[bytes, bytes]]], object]:
    """Every (key, value) of every order, in LMDB order, and the meta."""
    env = open_graph_env(path)
    try:
        meta = read_meta(env, path)
        out = {}
        for o in range(1, meta.max_order + 1):
            db = env.open_db(order_db_name(o), create=False)
            with env.begin(db=db) as txn:
                out[o] = list(txn.cursor())
        return out, meta
    finally:
        env.close()


def assert_same_graph(a: Path, b: Path) -> None:
    """Same contexts, successors and counts, entry by entry; same corpus figures."""
    ea, ma = graph_entries(a)
    eb, mb = graph_entries(b)
    assert ma.max_order == mb.max_order
    for o in ea:
        assert len(ea[o]) == len(eb[o]), f"order {o}: {len(ea[o])} vs {len(eb[o])} contexts"
        for (ka, va), (kb, vb) in zip(ea[o], eb[o], strict=True):
            assert ka == kb, f"order {o}: context {ka.hex()} vs {kb.hex()}"
            assert va == vb, f"order {o}: successors of {ka.hex()} differ"
    assert (ma.corpus_documents, ma.corpus_tokens) == (mb.corpus_documents, mb.corpus_tokens)
    assert ma.orders == mb.orders
