"""The core every part of :class:`~lance_async.AsyncDataset` stands on.

:class:`DatasetCore` holds the wrapped ``LanceDataset``, its storage options
and the two patterns every operation follows: engine calls on a worker
thread (:func:`engine_call`) and *copy, mutate, move* for anything that
commits (:meth:`DatasetCore._mutate`): the mutation runs on a private copy
checked out at the latest version, and this object moves to the version it
committed, never backwards, so concurrent reads never see the dataset object
change under them (pylance mutates its ``LanceDataset`` in place).

The groups of operations are mixins over this core, one module each
(``reads.py``, ``writes.py``, ``schema.py``, ``versions.py``,
``maintenance.py``, ``memwal.py``); ``facade.py`` assembles them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import pyarrow as pa
from lance.dataset import LanceDataset

from .._args import check_seconds
from .._engine_errors import raise_mapped
from .._schema import primary_key
from .._table import Table
from .._threads import default_storage_timeout, run_sync
from ..lsm.reader import LsmReader

__all__ = ["DatasetCore", "engine_call"]

T = TypeVar("T")
D = TypeVar("D", bound="DatasetCore")


async def engine_call(func: Callable[[], T]) -> T:
    """Run a blocking engine call on a worker thread (the library's engine
    limiter), mapping engine errors to lance_async's (``map_engine_error``)."""
    try:
        return await run_sync(func)
    except (OSError, ValueError, RuntimeError) as exc:
        raise_mapped(exc)
        raise


class DatasetCore:
    """What every group of dataset operations needs: the wrapped dataset,
    its storage options, identity, and the copy-mutate-move pattern.

    Parameters
    ----------
    dataset : lance.LanceDataset
        The pylance dataset to wrap (not copied).
    storage_options : dict, optional
        The object-store options it was opened with; every file lance_async
        reads itself (MemWAL manifests, generations) is read with them, and
        so is the dataset when it is used as a source.
    storage_timeout : float, optional
        Seconds a call that waits on the store may take before it is given
        up (see :attr:`storage_timeout`; default: the
        ``LANCE_ASYNC_STORAGE_TIMEOUT`` environment variable, else 60).
    """

    def __init__(
        self,
        dataset: LanceDataset,
        *,
        storage_options: Mapping[str, str] | None = None,
        storage_timeout: float | None = None,
    ) -> None:
        if storage_timeout is None:
            storage_timeout = default_storage_timeout()
        self._ds = dataset
        self._storage_options = dict(storage_options) if storage_options else None
        self.storage_timeout = check_seconds("storage_timeout", storage_timeout, positive=True)
        """Seconds a call that waits on the store may take before lance_async
        stops waiting and raises :class:`~lance_async.StorageTimeoutError`:
        opening the table, and every engine call of its MemWAL writers (the
        default of their own ``storage_timeout``). pylance retries some
        requests for ever (a MemWAL put on a store that refuses every
        request); the call's thread is then left behind (logged)."""
        self._schema_of: tuple[LanceDataset, int, pa.Schema, list[str]] | None = None
        self._checked_out = False
        self.lsm = LsmReader(cast("Table", self))
        """The LSM reads of this table: base, flushed generations and every
        shard's WAL tail, so every durable row, from any process
        (:class:`~lance_async.lsm.LsmReader`)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.uri!r} version={self.version}>"

    def _new(self: D, dataset: LanceDataset) -> D:
        """Another object of this class over ``dataset``, with the same options."""
        return type(self)(
            dataset, storage_options=self._storage_options, storage_timeout=self.storage_timeout
        )

    # -- identity (no I/O) --------------------------------------------------
    @property
    def lance(self) -> LanceDataset:
        """The underlying ``lance.LanceDataset`` (for sync code on a worker thread)."""
        return self._ds

    @property
    def checked_out(self) -> bool:
        """True for an object from :meth:`checkout`, until it moves to a newer
        version (``refresh()``, ``restore()`` or a commit through it).

        Plain reads of a checked-out object read its version (time travel);
        LSM reads, which show the live state of the MemWAL, refuse it with
        :class:`~lance_async.errors.InvalidInputError` rather than moving it
        to the latest version (as LanceDB refuses them). No I/O.
        """
        return self._checked_out

    @property
    def uri(self) -> str:
        """The dataset's URI."""
        return str(self._ds.uri)

    @property
    def storage_options(self) -> dict[str, str] | None:
        """The object-store options the dataset was opened with (a copy), or None."""
        return dict(self._storage_options) if self._storage_options else None

    @property
    def version(self) -> int:
        """The version this object reads (does not block)."""
        return int(self._ds.version)

    def _schema_and_key(self) -> tuple[pa.Schema, list[str]]:
        # pylance converts its schema to Arrow on every ``.schema`` (several
        # times per point lookup): kept per object and version
        ds = self._ds
        version = int(ds.version)
        cached = self._schema_of
        if cached is None or cached[0] is not ds or cached[1] != version:
            schema = ds.schema
            cached = self._schema_of = (ds, version, schema, primary_key(schema))
        return cached[2], cached[3]

    @property
    def schema(self) -> pa.Schema:
        """The dataset's Arrow schema, field metadata included (does not block)."""
        return self._schema_and_key()[0]

    @property
    def primary_key(self) -> list[str]:
        """Primary-key column names, from Lance's field metadata ([] if none)."""
        return list(self._schema_and_key()[1])

    # -- copy, mutate, move -------------------------------------------------
    def _advance(self, dataset: LanceDataset) -> None:
        """Move this object to ``dataset``, a newer version of the same table.

        Never moves backwards: an older ``dataset`` is ignored. Does not block.
        Part of the :class:`~lance_async._table.Table` protocol (the MemWAL,
        LSM and merge code move the dataset they were given this way).
        """
        if int(dataset.version) > self.version:
            self._checked_out = False  # moved on: no longer pinned by a checkout
        if int(dataset.version) >= self.version:
            self._ds = dataset

    async def _mutate(self, action: Callable[[LanceDataset], T]) -> T:
        """Run ``action`` on a private copy at the latest version, then move here.

        ``action(copy)`` runs on a worker thread with a ``LanceDataset`` checked
        out at the latest version; whatever it commits, this object then moves
        to the version it left the copy at (never backwards). Engine errors
        are mapped (:func:`~lance_async._engine_errors.raise_mapped`). Part of the
        :class:`~lance_async._table.Table` protocol.

        Returns
        -------
        The value ``action`` returned.
        """

        def work() -> tuple[LanceDataset, T]:
            copy = self._ds.checkout_version(self._ds.latest_version)
            result = action(copy)
            return copy, result

        copy, result = await engine_call(work)
        self._advance(copy)
        return result
