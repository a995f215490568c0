"""Executors of build tasks: the same task function, run locally or on a Dask cluster.

An engine maps :func:`builder.index_task.index_partition` over task specs (plain dicts) and
returns their manifests (plain dicts), calling ``on_done`` as each one finishes. It never passes
objects of ours between processes: only paths, offsets, numbers and strings.

- :class:`LocalEngine` (``--engine local``, the default): with one partition or one worker, the
  tasks run in this process (no start-up cost: small corpora build as fast as before); else in a
  pool of ``workers`` processes (default: every core), each given its share of the cores for
  the tokenizer (:func:`tokenizer_threads_env`). A worker process that dies fails the build
  cleanly (:class:`~builder.errors.BuildError`; nothing is published).
- :class:`DaskEngine` (``--engine dask``): a ``dask.distributed`` client, to the scheduler at
  ``address`` or to a new ``LocalCluster`` of ``workers`` processes with one thread each. A
  worker that dies mid-task is replaced and its task rerun by the scheduler (up to
  ``distributed.scheduler.allowed-failures`` times, then the build fails cleanly).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from builder.errors import BuildError
from builder.index_task import index_partition

log = logging.getLogger("builder")

Spec = dict[str, Any]
Manifest = dict[str, Any]
OnDone = Callable[[Manifest], None]
ENGINES = ("local", "dask")


def tokenizer_threads_env(workers: int) -> dict[str, str]:
    """Environment for a worker process: its share of the cores for the Rust tokenizer.

    The fast tokenizer's batch call uses every core (a rayon thread pool per process): with
    several worker processes on one machine, each gets ``cores // workers`` threads instead of
    fighting over all of them. An explicit ``RAYON_NUM_THREADS`` is kept.
    """
    if "RAYON_NUM_THREADS" in os.environ:
        return {"RAYON_NUM_THREADS": os.environ["RAYON_NUM_THREADS"]}
    return {"RAYON_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, workers)))}


def _init_worker(env: dict[str, str]) -> None:
    """Local pool worker start-up: set the environment before any tokenizer runs, and load
    transformers without torch (a worker only tokenizes)."""
    from speculant.torchless import import_transformers_without_torch

    os.environ.update(env)
    import_transformers_without_torch()


class Engine(Protocol):
    """Runs build tasks somewhere; see the module docstring."""

    name: str

    @property
    def workers(self) -> int: ...

    def map(self, specs: list[Spec], on_done: OnDone | None = None) -> list[Manifest]: ...

    def close(self) -> None: ...


class LocalEngine:
    """Tasks in this process, or in a pool of local worker processes."""

    name = "local"

    def __init__(self, workers: int | None = None) -> None:
        self._workers = max(1, workers or os.cpu_count() or 1)

    @property
    def workers(self) -> int:
        return self._workers

    def map(self, specs: list[Spec], on_done: OnDone | None = None) -> list[Manifest]:
        if len(specs) <= 1 or self._workers == 1:
            results = []
            for spec in specs:
                results.append(index_partition(spec))
                if on_done:
                    on_done(results[-1])
            return results
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        # spawn: a clean interpreter per worker (no forked tokenizer thread pools)
        ctx = multiprocessing.get_context("spawn")
        results: list[Manifest | None] = [None] * len(specs)
        n = min(self._workers, len(specs))
        pool = ProcessPoolExecutor(
            max_workers=n,
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(tokenizer_threads_env(n),),
        )
        try:
            futures = {pool.submit(index_partition, spec): i for i, spec in enumerate(specs)}
            for future in as_completed(futures):
                try:
                    results[futures[future]] = future.result()
                except BrokenProcessPool as exc:
                    raise BuildError(f"a local build worker process died: {exc}") from exc
                if on_done:
                    on_done(results[futures[future]])  # type: ignore[arg-type]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        pass


class DaskEngine:
    """Tasks on a Dask cluster: an existing one (``address``) or a new local one."""

    name = "dask"

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        client: Any = None,
        threads_per_worker: int = 1,
    ) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise BuildError(
                "--engine dask needs dask.distributed: pip install 'speculant-graph[distributed]'"
            ) from exc
        self._cluster = None
        self._own_client = client is None
        if client is not None:
            self.client = client
        elif address:
            try:
                self.client = Client(address, timeout="30s")
            except OSError as exc:
                raise BuildError(f"cannot reach the Dask scheduler at {address}: {exc}") from exc
        else:
            n = max(1, workers or os.cpu_count() or 1)
            self._cluster = LocalCluster(
                n_workers=n,
                env=tokenizer_threads_env(n),
                threads_per_worker=threads_per_worker,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            self.client = Client(self._cluster)
        self.address = self.client.scheduler.address

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info(n_workers=-1).get("workers", {}))

    def map(self, specs: list[Spec], on_done: OnDone | None = None) -> list[Manifest]:
        from distributed import as_completed

        run = secrets.token_hex(6)  # fresh keys: never a stale result of an earlier build
        keys = [f"speculant-count-{run}-{i:05d}" for i in range(len(specs))]
        futures = self.client.map(index_partition, specs, key=keys, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Manifest | None] = [None] * len(specs)
        try:
            for future in as_completed(futures):
                try:
                    manifest = future.result()
                except BuildError:
                    raise
                except Exception as exc:  # KilledWorker, a worker's OSError, ...
                    raise BuildError(
                        f"partition {index[future.key]} failed on the Dask cluster: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                results[index[future.key]] = manifest
                if on_done:
                    on_done(manifest)
        finally:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        if self._own_client:
            with contextlib.suppress(Exception):
                self.client.close()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close()


def make_engine(
    name: str, *, address: str | None = None, workers: int | None = None, client: Any = None
) -> Engine:
    """The engine called name (``local`` or ``dask``)."""
    if name == "local":
        if address:
            raise BuildError("--address is for --engine dask")
        return LocalEngine(workers)
    if name == "dask":
        return DaskEngine(address, workers, client=client)
    raise BuildError(f"unknown engine {name!r} (choose from {', '.join(ENGINES)})")
