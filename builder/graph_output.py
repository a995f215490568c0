"""Writing a graph: merging the parts into its index, putting the index and its meta into the
graph's LMDB environment and publishing it.

The index arrays are written as files in the build's scratch directory (the merge and the scans
run over their memory maps), then copied into the LMDB environment of a temporary directory
beside the graph's final path, which is published there atomically
(:func:`builder.publish.publishing`); a failed write removes the temporary directory and leaves
what was published before untouched.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from builder.index_writer import Part, write_index
from builder.lmdb_writer import GraphWriter, map_room
from builder.publish import publishing, remove_stale_temp_dirs
from speculant.graph_format import GraphMeta, OrderStats
from speculant.graph_store import array_layout
from speculant.suffix_index import INDEX_FILES, WEIGHTS_FILE

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
        arrays_dir = Path(tempfile.mkdtemp(prefix="index-", dir=scratch))
        try:
            orders, index = write_index(parts, arrays_dir, scratch, vocab_size, max_order)
            names = [*INDEX_FILES, WEIGHTS_FILE] if index["weighted"] else list(INDEX_FILES)
            arrays = {n: np.load(arrays_dir / n, mmap_mode="r", allow_pickle=False) for n in names}
            index["arrays"] = array_layout(arrays)
            meta = make_meta(orders, index)
            writer = GraphWriter(tmp, map_room([a.nbytes for a in arrays.values()]))
            try:
                writer.write_arrays(arrays)
                writer.write_meta(meta)
            finally:
                writer.close()
            del arrays
        finally:
            shutil.rmtree(arrays_dir, ignore_errors=True)
    return meta
