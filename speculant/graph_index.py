"""Opening a graph's suffix index (:mod:`speculant.suffix_index`): from its LMDB environment
(format 3, :mod:`speculant.graph_store`) or from the ``.npy`` files of a format 2 graph."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from speculant.graph_format import (
    NPY_FORMAT,
    GraphFormatError,
    GraphMeta,
    MappedFile,
    SharedGraphEnv,
)
from speculant.graph_manifest import manifest_sizes
from speculant.graph_store import read_arrays
from speculant.suffix_index import INDEX_FILES, WEIGHTS_FILE, SuffixIndex


def index_names(meta: GraphMeta) -> list[str]:
    """The arrays (file names) of the graph's index: the weights too in a weighted graph."""
    return [*INDEX_FILES, WEIGHTS_FILE] if meta.index.get("weighted") else list(INDEX_FILES)


def index_arrays(
    path: Path, env: SharedGraphEnv, meta: GraphMeta, guards: list[MappedFile]
) -> dict[str, np.ndarray]:
    """The index's arrays (read-only maps) by file name; a format 2 graph's files each get a
    damage guard, appended to ``guards`` (format 3: the environment's guards them all)."""
    if meta.format_version == NPY_FORMAT:
        return _npy_arrays(path, index_names(meta), guards)
    layout = meta.index.get("arrays")
    if not isinstance(layout, dict) or sorted(layout) != sorted(index_names(meta)):
        raise GraphFormatError(f"corrupt graph {path}: meta 'index.arrays' lists the wrong arrays")
    try:
        return read_arrays(env, layout, path)
    except (TypeError, ValueError) as exc:
        raise GraphFormatError(f"corrupt graph {path}: bad meta 'index.arrays' ({exc})") from exc


def open_index(
    path: Path, env: SharedGraphEnv, meta: GraphMeta, guards: list[MappedFile]
) -> SuffixIndex:
    """The graph's suffix index, its lookup kernels warmed up (see :func:`index_arrays`)."""
    arrays = index_arrays(path, env, meta, guards)
    try:
        index = SuffixIndex(arrays)
        index.warm_up()
    except (KeyError, IndexError, ValueError) as exc:
        raise GraphFormatError(f"corrupt graph {path}: inconsistent index arrays ({exc})") from exc
    return index


def _npy_arrays(path: Path, names: list[str], guards: list[MappedFile]) -> dict[str, np.ndarray]:
    """Map a format 2 graph's index files (each checked against the manifest first), guarding
    each map (speculant.graph_format)."""
    sizes = manifest_sizes(path, checksum=False)  # open_graph_env checksummed them
    arrays: dict[str, np.ndarray] = {}
    for name in names:
        if name not in sizes:
            raise GraphFormatError(f"corrupt graph {path}: {name} is missing from its manifest")
        file = path / name
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        guard = MappedFile(file, sizes[name], fd)
        guards.append(guard)
        try:
            array = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise GraphFormatError(f"corrupt graph {path}: unreadable {name} ({exc})") from exc
        stat = os.stat(file)
        if (stat.st_dev, stat.st_ino) != guard.file_id:
            raise GraphFormatError(f"graph {path}: {name} was replaced while it was opened")
        guard.find_regions()
        arrays[name] = array
    return arrays
