"""What every LSM read of a table shares: :class:`ReaderBase`.

The table, the live memtables a reader includes, the checks of the
arguments every read takes (columns, keys, a snapshot list, a point-in-time
view, a checked-out table) and the two reads of the LSM state itself
(:meth:`ReaderBase.snapshots`, :meth:`ReaderBase.snapshot`). The reads
build on it: the searches (``searches.py``), then
:class:`~lance_async.lsm.reader.LsmReader` (scans and point lookups), the
one class callers meet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import pyarrow as pa

from .._args import check_columns
from .._schema import NO_KEY
from .._table import Table
from .._threads import call_timeouts, run_engine
from ..errors import InvalidInputError, SchemaMismatchError, ViewExpiredError
from .expiry import expired_views
from .keyvalues import key_columns
from .levels import LsmView, open_view, take_snapshot
from .memtable import MemtableMirror
from .snapshots import LsmSnapshot, ShardSnapshot, ShardSnapshots, shard_snapshots

__all__ = ["Memtables", "ReaderBase", "Views", "fresh", "no_memtables"]

Memtables = Callable[[], Sequence[MemtableMirror]]
"""Returns the live memtables a reader includes (raises if their owner is closed)."""
T = TypeVar("T")


def no_memtables() -> Sequence[MemtableMirror]:
    """No live memtable: a dataset's reader, or a read of a pinned view."""
    return ()


async def fresh(read: Callable[[], Awaitable[T]], given: object) -> T:
    """``await read()``, a "not found" made :class:`~lance_async.errors.ViewExpiredError`;
    a read that discovers its own view (``given`` None: no snapshot list, no
    pinned snapshot) tries once more with a fresh one when a clean-up
    removed a file of the first."""
    try:
        with expired_views():
            return await read()
    except ViewExpiredError:
        if given is not None:
            raise
    with expired_views():
        return await read()


@dataclass(frozen=True)
class Views:
    """How one read opens its view of the levels (:meth:`ReaderBase._views`)."""

    open: Callable[[], Awaitable[LsmView]]
    """Opens the view (the table's I/O on worker threads)."""
    given: object
    """The snapshot list or pinned view the read was given; None: discovered now."""

    async def run(self, work: Callable[[LsmView], T], timeout: float | None) -> T:
        """Open the view and run blocking ``work(view)`` on a worker thread,
        once more on a fresh view if a clean-up removed a file of the first
        (:func:`fresh`); ``timeout`` is the table's storage timeout."""

        async def read() -> T:
            view = await self.open()
            return await run_engine(partial(work, view))

        with call_timeouts(timeout):
            return await fresh(read, self.given)


class ReaderBase:
    """The table, its live memtables and the checks of an LSM read (see the module notes).

    Parameters
    ----------
    table : Table
        The table read (an :class:`~lance_async.AsyncDataset`).
    memtables : callable, optional
        This process's live memtables to read besides the stored levels.
    path : str
        The metrics label of these reads.
    """

    def __init__(
        self, table: Table, memtables: Memtables | None = None, *, path: str = "lsm"
    ) -> None:
        self._table = table
        self._memtables = memtables or no_memtables
        self._path = path

    def __repr__(self) -> str:
        return f"<LsmReader {self._table.uri!r} path={self._path}>"

    # -- checks (no I/O) -----------------------------------------------------
    def _columns(self, columns: Sequence[str] | None) -> list[str] | None:
        check_columns(columns)
        if columns is None:
            return None
        schema = self._table.schema
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise SchemaMismatchError(f"no column {missing[0]!r} in the table", field=missing[0])
        return list(columns)

    def _keys(self, values: Any) -> list[pa.Array]:
        pk = self._table.primary_key
        if not pk:
            raise InvalidInputError(NO_KEY)
        return key_columns(self._table.schema, pk, values)

    @staticmethod
    def _snapshots(snapshots: ShardSnapshots | None) -> list[ShardSnapshot] | None:
        if snapshots is None:
            return None
        snaps = list(snapshots)
        if not all(isinstance(s, ShardSnapshot) for s in snaps):
            raise InvalidInputError(
                "LSM reads take lance_async ShardSnapshot objects (dataset.lsm.snapshots())"
            )
        return snaps

    def _pinned(
        self, snapshot: LsmSnapshot | None, snapshots: ShardSnapshots | None
    ) -> LsmSnapshot | None:
        """The point-in-time view of a read, checked (no I/O)."""
        if snapshot is None:
            return None
        if snapshots is not None:
            raise ValueError("give snapshot= (a point-in-time view) or snapshots=, not both")
        if not isinstance(snapshot, LsmSnapshot):
            raise InvalidInputError(
                f"snapshot= takes an LsmSnapshot (await dataset.lsm.snapshot()), "
                f"got {type(snapshot).__name__}"
            )
        if snapshot.uri != self._table.uri:
            raise InvalidInputError(
                f"this snapshot is of {snapshot.uri!r}, not of {self._table.uri!r}"
            )
        return snapshot

    def _check_live(self, snaps: object, pin: object) -> None:
        """Refuse a read that discovers the live state on a checked-out table.

        Such a read moves the table object to the latest version (it reads the
        MemWAL, which is live state): on an object from ``checkout(version)``
        that would silently end its time travel. A read of snapshots given
        (``snapshots=``, ``snapshot=``) is allowed. LanceDB refuses the same.
        """
        if snaps is None and pin is None and self._table.checked_out:
            raise InvalidInputError(
                f"{self._table.uri!r} is checked out at version {self._table.version}: "
                "an LSM read shows the table's live state (the MemWAL is not versioned "
                "with the base table); read that version with plain reads, or await "
                "refresh() (or open the table again) to read it live"
            )

    def _views(self, snapshots: ShardSnapshots | None, snapshot: LsmSnapshot | None) -> Views:
        """The checks every read of the levels makes (no I/O), and how it
        opens its view: the shards listed, the pinned view, or now (with this
        reader's live memtables)."""
        snaps = self._snapshots(snapshots)
        pin = self._pinned(snapshot, snapshots)
        self._check_live(snaps, pin)
        memtables = self._memtables if pin is None else no_memtables
        memtables()  # a closed owner raises here, at the call
        table = self._table

        def opener() -> Awaitable[LsmView]:
            return open_view(table, snaps, memtables(), pinned=pin)

        return Views(opener, snaps or pin)

    # -- reads ---------------------------------------------------------------
    async def snapshots(self) -> list[ShardSnapshot]:
        """Each live shard's flushed generations and where its WAL tail starts
        (see :func:`~lance_async.lsm.snapshots.shard_snapshots`)."""
        self._check_live(None, None)
        self._memtables()
        with call_timeouts(self._table.storage_timeout):
            return await shard_snapshots(self._table)

    async def snapshot(self) -> LsmSnapshot:
        """Pin the table's LSM state now: a point-in-time view for later reads.

        Every read given the result (``snapshot=``: :meth:`scan`,
        :meth:`point_lookup`, :meth:`point_lookups`, :meth:`vector_search`)
        sees exactly the state of this moment -- the shard set, each shard's
        flushed generations and WAL position, the base table's version, and
        (through a writer's or router's reader) the rows of its live
        memtables -- however long it is held and whatever is written,
        flushed or compacted meanwhile, in any process. Reads without one
        see the table as it is when they run.

        Returns
        -------
        LsmSnapshot
            Immutable, holds no resource; one of a dataset's reader pickles
            (another process may read the same view).

        Raises
        ------
        InvalidInputError
            The table has no primary key.
        ClosedError
            The writer (or router) this reader belongs to is not open.

        Notes
        -----
        One thread hop: the latest version, the shard manifests, each
        shard's WAL tail read to its end (cached for the reads that follow).
        A view stays readable while the files it pins exist: past the
        MemWAL's storage retention (or a ``cleanup_old_versions`` of its
        base version) its reads raise
        :class:`~lance_async.errors.ViewExpiredError`. A storage engine's
        read snapshot (RocksDB's ``GetSnapshot()``) is the model.
        """
        self._check_live(None, None)
        mirrors = self._memtables()
        with call_timeouts(self._table.storage_timeout):
            return await take_snapshot(self._table, mirrors)
