"""Writing a graph: merging the parts into its index, writing its meta and publishing it.

The graph is written into a temporary directory beside its final path and published there
atomically (:func:`builder.publish.publishing`); a failed write removes the temporary directory
and leaves what was published before untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.index_writer import Part, write_index
from builder.lmdb_writer import GraphWriter
from builder.publish import publishing, remove_stale_temp_dirs
from speculant.graph_format import GraphMeta, OrderStats

log = logging.getLogger("builder")

# The meta record of the graph written, from its order statistics and its index description.
MakeMeta = Callable[[list[OrderStats], dict[str, Any]], GraphMeta]


def write_graph(
    out: Path,
    parts: list[Part],
    scratch: Path,
    vocab_size: int,
    max_order: int,
    make_meta: MakeMeta,
) -> GraphMeta:
    """Merge parts (scratch: room for temporary runs), write the graph with make_meta's meta
    and publish it at out; the meta written."""
    remove_stale_temp_dirs(out)
    with publishing(out) as tmp:
        log.info("merging %d part(s) and writing graph to %s (in %s)", len(parts), out, tmp.name)
        orders, index = write_index(parts, tmp, scratch, vocab_size, max_order)
        meta = make_meta(orders, index)
        writer = GraphWriter(tmp)
        try:
            writer.write_meta(meta)
        finally:
            writer.close()
    return meta
