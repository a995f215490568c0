"""Rewriting the meta record of a published graph, atomically, with a fresh manifest.

A published graph is never modified in place: draft services map its ``data.mdb`` read-only
without a lock file, so an in-place LMDB write could reuse pages a reader still uses. Instead
the graph's files are copied into a temporary directory beside it (``.<name>.tmp-<pid>-*``,
the builder's naming, see :mod:`builder.publish`), the meta record is replaced there in one
LMDB write transaction, ``manifest.json`` is recomputed for the new ``data.mdb``, and the copy
is published over the graph by an atomic swap. Readers that have the old graph open keep
reading the old file; new readers see the new one. A crash leaves the old graph untouched.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import lmdb

from builder.append import append_lock
from builder.publish import publishing
from speculant.graph_format import (
    MAX_SUPPORTED_ORDER,
    META_DB,
    META_KEY,
    GraphFormatError,
    GraphMeta,
    open_graph_env,
    read_meta,
)
from speculant.graph_manifest import DATA_FILE, MANIFEST_FILE

_SKIP = {MANIFEST_FILE, "lock.mdb"}  # rewritten / never part of a published graph


def update_meta(path: str | Path, change: Callable[[GraphMeta], GraphMeta]) -> GraphMeta:
    """Replace the graph's meta record by change(meta) and republish it atomically; the new
    meta. GraphFormatError when path is not a sound graph (its manifest, where it has one,
    must match: a damaged graph is not re-checksummed into a valid-looking one)."""
    path = Path(path)
    with append_lock(path):  # an append publishing meanwhile would be lost, or lose this
        env = open_graph_env(path, checksum=True)
        try:
            meta = change(read_meta(env, path))
        finally:
            env.close()
        with publishing(path) as tmp:
            for entry in path.iterdir():
                if entry.is_file() and entry.name not in _SKIP:
                    _link_or_copy(entry, tmp / entry.name)
            _write_meta(tmp, meta)
    return meta


def _write_meta(directory: Path, meta: GraphMeta) -> None:
    """Put the meta record into the copy's LMDB environment (one transaction, synced)."""
    size = (directory / DATA_FILE).stat().st_size
    try:
        env = lmdb.open(
            str(directory),
            map_size=2 * size + (64 << 20),
            max_dbs=MAX_SUPPORTED_ORDER + 2,
            subdir=True,
            lock=False,  # a private copy: no other reader or writer
            create=False,
        )
    except lmdb.Error as exc:
        raise GraphFormatError(f"cannot open the graph copy {directory}: {exc}") from exc
    try:
        db = env.open_db(META_DB, create=False)
        with env.begin(write=True, db=db) as txn:
            txn.put(META_KEY, meta.to_json())
        env.sync(True)
    finally:
        env.close()


def _link_or_copy(source: Path, target: Path) -> None:
    """target as a hard link to source (a published graph's files never change in place, so the
    new version may share them), or a copy where the file system has no links. The LMDB file is
    always copied: the new meta is written into it."""
    if source.name != DATA_FILE:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copyfile(source, target)
