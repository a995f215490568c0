"""Writing a graph's LMDB environment: its index arrays, then its meta record (format:
:mod:`speculant.graph_format`, :mod:`speculant.graph_store`).

The environment is opened with ``writemap``: LMDB writes each value straight into its shared
file map, so a value of any size costs page cache, not private memory. The file gets its disk
blocks first (a full disk is then an error naming the file, never a SIGBUS) and is cut back to
its last used page at close. The index arrays go in one transaction; the meta record is written
last, in its own transaction, and synced: a graph directory without it is unfinished and never
served.
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import numpy as np

from builder.disk import allocate, write_failure
from builder.errors import BuildError
from speculant.graph_format import META_DB, META_KEY, GraphMeta
from speculant.graph_manifest import DATA_FILE
from speculant.graph_store import INDEX_DB, MAX_VALUE_BYTES, array_key

GRAPH_HINT = "the graph is written beside --out: free space on that disk"
PAGE = 4096  # LMDB's page size on the platforms served (env.stat()["psize"] is checked)
SLACK_PAGES = 256  # room for the B-tree pages, the meta record and the free list


def map_room(array_bytes: list[int]) -> int:
    """The map size a graph of arrays of these sizes needs: each array in its own overflow
    pages (a 16-byte header first), plus slack."""
    return PAGE * (sum((n + 16 + PAGE - 1) // PAGE for n in array_bytes) + SLACK_PAGES)


def _raw(array: np.ndarray) -> bytes | memoryview:
    """The array's bytes, without a copy (a C-contiguous array)."""
    return memoryview(np.ascontiguousarray(array)).cast("B") if array.size else b""


class GraphWriter:
    """Creates the LMDB environment of a graph in an (empty, temporary) directory."""

    def __init__(self, path: Path, map_size: int = PAGE * SLACK_PAGES) -> None:
        self.path = path
        try:
            self.env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=3,
                subdir=True,
                lock=False,  # one writer, in a private directory
                writemap=True,  # values go straight into the file's map (no private copy)
                sync=False,  # synced once at the end (close)
                metasync=False,
                readahead=False,
                meminit=False,
            )
        except lmdb.Error as exc:
            raise write_failure(path / DATA_FILE, exc, GRAPH_HINT) from exc
        if self.env.stat()["psize"] != PAGE:
            raise BuildError(f"LMDB page size {self.env.stat()['psize']} (expected {PAGE})")
        allocate(path / DATA_FILE, GRAPH_HINT)

    def write_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Put the index arrays (by file name) into the database ``index``, one transaction."""
        for name, array in arrays.items():
            if array.nbytes > MAX_VALUE_BYTES:
                raise BuildError(
                    f"the graph's {array_key(name).decode()} array has {array.nbytes:,} bytes; "
                    f"an LMDB value holds at most {MAX_VALUE_BYTES:,}: build several graphs"
                )
        self._put(INDEX_DB, [(array_key(n), _raw(a)) for n, a in arrays.items()])

    def write_meta(self, meta: GraphMeta) -> None:
        """Write the meta record (last: a graph without it is unfinished)."""
        self._put(META_DB, [(META_KEY, meta.to_json())])

    def _put(self, db_name: bytes, items: list[tuple[bytes, bytes | memoryview]]) -> None:
        """Put the items into the named database in one transaction, growing the map when
        it is full."""
        while True:
            try:
                db = self.env.open_db(db_name, create=True)
                with self.env.begin(write=True, db=db) as txn:
                    for key, value in items:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
                allocate(self.path / DATA_FILE, GRAPH_HINT)
            except lmdb.Error as exc:  # e.g. the disk is full
                raise write_failure(self.path / DATA_FILE, exc, GRAPH_HINT) from exc

    def close(self) -> None:
        """Flush everything to disk (fsync), close the environment and cut the file back to
        its last used page."""
        data = self.path / DATA_FILE
        try:
            self.env.sync(True)
            used = (self.env.info()["last_pgno"] + 1) * PAGE
        except lmdb.Error as exc:
            raise write_failure(data, exc, GRAPH_HINT) from exc
        finally:
            self.env.close()
        try:
            fd = os.open(data, os.O_RDWR)
            try:
                os.ftruncate(fd, used)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise write_failure(data, exc, GRAPH_HINT) from exc
