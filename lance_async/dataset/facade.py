"""``AsyncDataset``: a Lance dataset whose every blocking call runs off the loop.

:func:`open_dataset` and :func:`write_dataset` are the entry points. The
class is assembled from one mixin per group of operations over
:class:`~._core.DatasetCore`:

=================== ================================================================
mixin               operations
=================== ================================================================
``ReadsMixin``      scan, to_table, count_rows, take, head, sample
``WritesMixin``     insert, delete, update, truncate_table, merge_insert, commit,
                    commit_batch
``SchemaMixin``     add / alter / drop columns, metadata, configuration
``VersionsMixin``   versions, checkout, refresh, restore, tags
``MaintenanceMixin`` indexes, optimize_indices, compact_files, cleanup, validate
``MemWalMixin``     MemWAL writers, LSM reads, compaction
=================== ================================================================

``docs/parity.md`` maps every public ``LanceDataset`` method of pylance
to its twin here, or says why there is none.

An ``AsyncDataset`` is also a write source wherever a ``LanceDataset`` is
(merge_insert, write_dataset, shard writers): REPLAYABLE, pinned to the
version it reads when it is passed, read with its storage options.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

import anyio
import lance
import pyarrow as pa
from lance.dataset import LanceDataset

from .._args import check_int, check_seconds
from .._engine_errors import map_engine_error
from .._schema import describe_difference
from .._threads import default_storage_timeout, run_sync
from ..errors import DatasetNotFoundError, SchemaMismatchError
from ..sources import WriteSource, coerce_source
from ..sources.kinds import LanceDatasetSource
from .maintenance import MaintenanceMixin
from .memwal import MemWalMixin
from .reads import ReadsMixin
from .schema import SchemaMixin
from .versions import VersionsMixin
from .writes import WritesMixin, write_source

__all__ = ["AsyncDataset", "open_dataset", "write_dataset"]

_D = TypeVar("_D", bound="AsyncDataset")


class AsyncDataset(
    ReadsMixin, WritesMixin, SchemaMixin, VersionsMixin, MaintenanceMixin, MemWalMixin
):
    """A Lance dataset for async code (asyncio or trio).

    Obtain one with :func:`open_dataset` or :func:`write_dataset`. Every
    method that touches storage is a coroutine and runs its pylance call on a
    worker thread (see :func:`lance_async.configure_threads`); mutations work
    on a private copy and then move this object to the version they committed
    (pylance moves its ``LanceDataset`` in place), so reads in flight never
    see the object change under them. ``docs/parity.md`` lists the twin of
    every ``LanceDataset`` method.

    Parameters
    ----------
    dataset : lance.LanceDataset
        The pylance dataset to wrap (not copied).
    storage_options : dict, optional
        The object-store options it was opened with; every file lance_async
        reads itself (MemWAL manifests, generations) is read with them.

    Notes
    -----
    An ``AsyncDataset`` passed as a write source (to ``merge_insert``,
    :func:`write_dataset`, ``insert``, a shard writer) is REPLAYABLE: it is
    pinned to the version it reads at that moment, and a conflict retry
    scans that version again.

    ``async with ds:`` works, so a dataset composes with the library's other
    objects, but leaving the block releases nothing and the dataset stays
    usable: it holds no thread, task or connection of its own (pylance frees
    its engine objects with it). What it opens that does hold them -- shard
    writers, routers, scans, compactors -- is its own ``async with``.
    """

    async def __aenter__(self: _D) -> _D:
        """``self``; nothing is opened (does not block)."""
        await anyio.lowlevel.checkpoint()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Nothing to release (see the class notes); a checkpoint only."""
        await anyio.lowlevel.checkpoint()


@coerce_source.register(AsyncDataset)
def _async_dataset_source(obj: AsyncDataset, *, schema: pa.Schema | None = None) -> WriteSource:
    """An ``AsyncDataset`` as a source: its dataset pinned to the version it
    reads now (REPLAYABLE), opened with its storage options."""
    source = LanceDatasetSource(obj.lance, version=obj.version)
    if schema is not None:
        diff = describe_difference(schema, source.schema)
        if diff is not None:
            raise SchemaMismatchError(
                f"the dataset does not match schema=: {diff[0]}", field=diff[1]
            )
    return source


async def open_dataset(
    uri: str | os.PathLike[str],
    *,
    version: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
    storage_timeout: float | None = None,
    **options: Any,
) -> AsyncDataset:
    """Open a Lance dataset without blocking the loop.

    Parameters
    ----------
    uri : str or PathLike
        Local path or object-store URI.
    version : int or str, optional
        A version number or tag; default the latest.
    storage_options : dict, optional
        Passed to pylance.
    storage_timeout : float, optional
        Seconds the open, and each engine call of the dataset's MemWAL
        writers, may wait on the store before it is given up (default: the
        ``LANCE_ASYNC_STORAGE_TIMEOUT`` environment variable, else 60; see
        :attr:`AsyncDataset.storage_timeout`).
    **options
        Other ``lance.dataset`` arguments (``commit_lock``, caches, ...).

    Returns
    -------
    AsyncDataset

    Raises
    ------
    DatasetNotFoundError
        The store answered that no dataset (or no such version) is at ``uri``.
    StorageError
        The store refused (:class:`StoragePermissionError`), has no such
        bucket (:class:`StorageNotFoundError`), is unavailable
        (:class:`StorageUnavailableError`, retryable) or did not answer
        within ``storage_timeout`` (:class:`StorageTimeoutError`).
    ValueError, TypeError
        A version number below 1, a ``storage_timeout`` not > 0 (at the call).
    """
    if version is not None and not isinstance(version, str):
        check_int("version", version, minimum=1)
    if storage_timeout is None:
        storage_timeout = default_storage_timeout()
    check_seconds("storage_timeout", storage_timeout, positive=True)
    path = os.fspath(uri)

    def work() -> LanceDataset:
        return lance.dataset(
            path,
            version=version,
            storage_options=dict(storage_options) if storage_options else None,
            **options,
        )

    try:
        opened = await run_sync(work, timeout=storage_timeout, what=f"opening {path!r}")
    except (OSError, ValueError, RuntimeError) as exc:
        mapped = map_engine_error(exc)
        if isinstance(mapped, DatasetNotFoundError):
            if version is not None and await anyio.Path(path, "_versions").is_dir():
                raise DatasetNotFoundError(
                    f"the Lance dataset at {path!r} has no version {version!r}"
                ) from exc
            raise DatasetNotFoundError(
                f"no Lance dataset at {path!r}; check the path or create it with write_dataset"
            ) from exc
        if mapped is not None:
            raise mapped from exc
        if "Not a directory" in str(exc):  # a file, not a table's folder
            raise DatasetNotFoundError(f"no Lance dataset at {path!r} (it is a file)") from exc
        raise
    return AsyncDataset(opened, storage_options=storage_options, storage_timeout=storage_timeout)


async def write_dataset(
    source: Any,
    uri: str | os.PathLike[str],
    *,
    mode: str = "create",
    schema: pa.Schema | None = None,
    storage_timeout: float | None = None,
    **lance_kwargs: Any,
) -> AsyncDataset:
    """Write a source to a Lance dataset, streaming it from the source.

    Parameters
    ----------
    source : anything :func:`~lance_async.coerce_source` accepts
        Tables, readers, datasets, (async) iterators of batches, files...
        Streams are never materialized: a bounded bridge feeds the writer.
    uri : str or PathLike
        Where to write.
    mode : {"create", "append", "overwrite"}
    schema : pa.Schema, optional
        Schema of the rows (and of a new dataset: put primary-key metadata
        here). Materialized inputs are converted to it losslessly; streams
        are checked against it batch by batch.
    storage_timeout : float, optional
        The returned dataset's :attr:`~AsyncDataset.storage_timeout` (default:
        ``LANCE_ASYNC_STORAGE_TIMEOUT``, else 60; the write itself streams
        for as long as the source lasts).
    **lance_kwargs
        Passed to ``lance.write_dataset`` (``max_rows_per_file``,
        ``data_storage_version``, ``storage_options``, ...).

    Returns
    -------
    AsyncDataset
        At the version written.

    Raises
    ------
    ValueError
        An unknown ``mode`` (at the call).
    SchemaMismatchError
        A batch does not match the schema, or (``mode="append"``) the
        dataset's schema (nothing is committed).
    InvalidInputError
        ``mode="create"`` where a dataset already exists.
    BaseException
        Whatever the source raised, as itself (nothing is committed).
    """
    if storage_timeout is None:
        storage_timeout = default_storage_timeout()
    check_seconds("storage_timeout", storage_timeout, positive=True)
    written = await write_source(source, uri, mode=mode, schema=schema, lance_kwargs=lance_kwargs)
    return AsyncDataset(
        written,
        storage_options=lance_kwargs.get("storage_options"),
        storage_timeout=storage_timeout,
    )
