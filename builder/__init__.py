"""The graph builder: corpus files -> exact n-gram counts -> an LMDB graph, published atomically.

``from builder import GraphBuilder``; see :mod:`builder.graph_builder` for the document policy
and the pipeline, :mod:`speculant.graph_format` for the on-disk layout. Names are imported
lazily so that ``speculant`` (which imports :mod:`builder.cli`) starts without numpy or lmdb.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["BuildError", "BuildStats", "CorpusError", "GraphBuilder"]

if TYPE_CHECKING:
    from builder.errors import BuildError, CorpusError
    from builder.graph_builder import BuildStats, GraphBuilder


def __getattr__(name: str) -> Any:
    if name in ("BuildError", "CorpusError"):
        from builder import errors

        return getattr(errors, name)
    if name in ("BuildStats", "GraphBuilder"):
        from builder import graph_builder

        return getattr(graph_builder, name)
    raise AttributeError(f"module 'builder' has no attribute {name!r}")
