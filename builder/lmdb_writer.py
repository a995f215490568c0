"""Writing a graph's LMDB environment: its meta record (format: :mod:`speculant.graph_format`).

The meta record is written last, once the index files are in place, in its own transaction,
and synced: a graph directory without it is unfinished and never served.
"""

from __future__ import annotations

from pathlib import Path

import lmdb

from builder.disk import write_failure
from speculant.graph_format import META_DB, META_KEY, GraphMeta
from speculant.graph_manifest import DATA_FILE

GRAPH_HINT = "the graph is written beside --out: free space on that disk"


class GraphWriter:
    """Creates the LMDB environment of a graph in an (empty, temporary) directory."""

    def __init__(self, path: Path, map_size: int = 1 << 24) -> None:
        self.path = path
        self.env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=2,
            subdir=True,
            lock=False,  # one writer, in a private directory
            sync=False,  # synced once at the end (close)
            metasync=False,
            readahead=False,
            meminit=False,
        )

    def write_meta(self, meta: GraphMeta) -> None:
        """Write the meta record (last: a graph without it is unfinished)."""
        db = self.env.open_db(META_DB, create=True)
        while True:
            try:
                with self.env.begin(write=True, db=db) as txn:
                    txn.put(META_KEY, meta.to_json())
                return
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except lmdb.Error as exc:  # e.g. the disk is full
                raise write_failure(self.path / DATA_FILE, exc, GRAPH_HINT) from exc

    def close(self) -> None:
        """Flush everything to disk (fsync) and close the environment."""
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            raise write_failure(self.path / DATA_FILE, exc, GRAPH_HINT) from exc
        finally:
            self.env.close()
