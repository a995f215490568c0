"""The graph builder: corpus files -> a suffix index of the corpus -> a graph, published atomically.

``from builder import GraphBuilder``; see :mod:`builder.graph_builder` for the document policy,
:mod:`speculant.graph_format` and :mod:`speculant.suffix_index` for the on-disk layout.

One code path, several executors:

1. plan: the corpus files are cut into partitions at document boundaries
   (:mod:`builder.partition`); a Hugging Face dataset is split by its streaming shards
   (:mod:`builder.dataset_source`);
2. index: an engine (:mod:`builder.engines`: this process, local worker processes or a Dask
   cluster) runs one task per partition (:mod:`builder.index_task`; progress shown by
   :mod:`builder.task_runner`): documents are read as a
   stream (:mod:`builder.corpus`), tokenized in batches (:mod:`builder.tokenize`), and the
   partition's token stream and its positions sorted by the text before them
   (:mod:`speculant.suffix_index`) are written into the task's directory under the shared work
   directory;
3. merge: this process concatenates the partitions' streams, merges their sorted positions and
   derives the tables of the index (:mod:`builder.index_writer`) in a temporary directory that
   is published atomically (:mod:`builder.publish`), the meta record in LMDB
   (:mod:`builder.lmdb_writer`); :mod:`builder.graph_output` runs this step.

Counts are read from the index, so the graph does not depend on the engine or the partitioning,
and an append (``save(path, append=True)``, :mod:`builder.append`) merges the published graph's
index with the new corpus's: the result equals a build of both corpora.

Names are imported lazily so that ``speculant`` (which imports :mod:`builder.cli`) starts
without numpy or lmdb.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["BuildError", "BuildStats", "CorpusError", "GraphBuilder"]

if TYPE_CHECKING:
    from builder.build_stats import BuildStats
    from builder.errors import BuildError, CorpusError
    from builder.graph_builder import GraphBuilder


def __getattr__(name: str) -> Any:
    if name in ("BuildError", "CorpusError"):
        from builder import errors

        return getattr(errors, name)
    if name == "BuildStats":
        from builder.build_stats import BuildStats

        return BuildStats
    if name == "GraphBuilder":
        from builder.graph_builder import GraphBuilder

        return GraphBuilder
    raise AttributeError(f"module 'builder' has no attribute {name!r}")
