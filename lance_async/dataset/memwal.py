"""The MemWAL and its LSM reads, as methods of the dataset (``MemWalMixin``).

The work is done in the ``memwal`` package, which takes the dataset as an
argument; these methods only check their arguments and call down.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from typing_extensions import Unpack

from .._args import check_int, check_seconds
from .._engine_errors import raise_mapped
from .._threads import call_timeouts
from ..memwal import retired
from ..memwal.check import ShardCheck, check_shards
from ..memwal.compaction import compact_mem_wal
from ..memwal.compactor import CompactionPolicy, Compactor
from ..memwal.policy import WriterOptions
from ..memwal.router import ShardRouter
from ..memwal.sharding import Sharding, read_sharding, sharding_options
from ..memwal.writer import AsyncShardWriter
from ._core import DatasetCore, engine_call

if TYPE_CHECKING:
    from ..memwal.compaction import CompactionResult
    from .facade import AsyncDataset

__all__ = ["MemWalMixin"]

D = TypeVar("D", bound="MemWalMixin")


def _writer_options(options: WriterOptions) -> None:
    """Options every writer takes, checked at the call (a writer's own
    checks run when it is built; a routing writer builds its writers later)."""
    if "linger" in options:
        check_seconds("linger", options["linger"])
    if "close_timeout" in options:
        check_seconds("close_timeout", options["close_timeout"])


class MemWalMixin(DatasetCore):
    """MemWAL writers, LSM reads and compaction of :class:`~lance_async.AsyncDataset`.

    The LSM reads are the dataset's :class:`~lance_async.lsm.LsmReader`
    (``dataset.lsm``).
    """

    def _facade(self) -> AsyncDataset:
        """This object as the ``AsyncDataset`` the memwal functions take (it is one)."""
        return cast("AsyncDataset", self)

    async def initialize_mem_wal(self: D, *, manual_shards: bool = False, **options: Any) -> D:
        """Enable the MemWAL (``LanceDataset.initialize_mem_wal``, every pylance
        argument accepted); returns ``self`` at the new version.

        Every key must have one shard (Lance's MemWAL spec), so the MemWAL
        gets a sharding spec: with no sharding option, bucket sharding on the
        (first) primary-key column into
        :data:`~lance_async.memwal.sharding.DEFAULT_NUM_BUCKETS` buckets.
        ``num_buckets=`` alone buckets on the key; pass ``bucket_column=`` too,
        ``identity_column=`` or
        ``unsharded=True`` to choose, or ``manual_shards=True`` for pylance's
        manual mode (shard ids are then the callers' to choose, and keeping
        every key in one shard is theirs too; see ``docs/sharding.md``).

        Shard folders left by an earlier MemWAL of this table (pylance keeps
        them when a table is overwritten) are retired first, in a commit of
        their own: LSM reads leave them out, writers refuse them, derived
        shard ids change (see ``lance_async.memwal.retired``).

        Raises
        ------
        InvalidInputError
            The table (at its latest version) has no primary key (pylance
            would accept the MemWAL, but LSM reads and compaction need the
            key, so its rows could never be read back); the MemWAL is already
            initialized, or was by a concurrent call; an unknown maintained
            index (the engine's "Invalid user input"). Nothing is committed.
        ValueError
            Conflicting sharding options (raised by pylance); ``num_buckets``
            outside 1..1024 (the bound pylance enforces; at the call).
        """
        chosen = sharding_options(self.schema, options, manual_shards)
        storage = self._storage_options
        await self._mutate(lambda d: retired.initialize_mem_wal(d, chosen, storage))
        return self

    async def check_shards(self) -> ShardCheck:
        """Find keys in more than one shard, or in the wrong shard (see
        :func:`lance_async.memwal.check.check_shards`)."""
        return await check_shards(self._facade())

    async def sharding(self) -> Sharding:
        """How the MemWAL maps rows to shards (:class:`~lance_async.memwal.sharding.Sharding`).

        Raises
        ------
        InvalidInputError
            No MemWAL is initialized.
        """
        return await read_sharding(self._facade())

    async def mem_wal_index_details(self) -> dict[str, Any] | None:
        """The MemWAL index details (shards, specs, writer defaults) or None."""
        await self._facade().refresh()
        details = await engine_call(self._ds.mem_wal_index_details)
        return dict(details) if details is not None else None

    @overload
    def mem_wal_writer(
        self,
        shard_id: None = None,
        *,
        compaction: CompactionPolicy | None = None,
        **options: Unpack[WriterOptions],
    ) -> ShardRouter: ...

    @overload
    def mem_wal_writer(
        self, shard_id: str, **options: Unpack[WriterOptions]
    ) -> AsyncShardWriter: ...

    def mem_wal_writer(
        self,
        shard_id: str | None = None,
        *,
        compaction: CompactionPolicy | None = None,
        **options: Unpack[WriterOptions],
    ) -> AsyncShardWriter | ShardRouter:
        """A MemWAL writer; use it as ``async with``.

        With no ``shard_id``: a :class:`~lance_async.ShardRouter`, which puts
        every row in its own shard (by the table's sharding spec) through one
        writer per shard, opened lazily. This is the writer to use unless
        shards are divided among processes. With a ``shard_id``: an
        :class:`~lance_async.AsyncShardWriter` of that one shard, which refuses
        rows of other shards (:class:`~lance_async.errors.WrongShardError`).
        ``options`` are the writer's, each a named keyword
        (:class:`~lance_async.WriterOptions`: the commit policy, queue
        and put limits, timeouts, and the engine writer's own, such as
        ``durable_write`` and ``max_memtable_rows``); the router also takes
        ``compaction=CompactionPolicy(...)`` to compact flushed generations in
        the background while it is open (for one shard writer, run a
        :class:`~lance_async.memwal.Compactor` beside it).

        Raises
        ------
        ValueError, TypeError
            A shard id that is not a UUID, an option out of range,
            ``compaction=`` for one shard's writer (at the call).
        """
        _writer_options(options)
        if shard_id is None:
            return ShardRouter(self._facade(), compaction=compaction, **options)
        if compaction is not None:
            raise TypeError(
                "compaction= is for the routing writer (mem_wal_writer() with no shard id); "
                "beside one shard writer, use `async with lance_async.memwal.Compactor(ds, policy)`"
            )
        return AsyncShardWriter(self._facade(), shard_id, **options)

    def compactor(self, policy: CompactionPolicy | None = None) -> Compactor:
        """A background :class:`~lance_async.memwal.Compactor` of this table (``async with``)."""
        return Compactor(self._facade(), policy)

    # -- LSM reads (lsm/) -------------------------------------------------
    async def compact_mem_wal(
        self,
        shard_ids: Iterable[str] | None = None,
        *,
        chunk_rows: int = 65_536,
        optimize_indices: bool = True,
        max_generations: int | None = None,
    ) -> CompactionResult:
        """Merge flushed MemWAL generations into the base table.

        Every flushed, not yet compacted generation of each shard (all shards,
        or ``shard_ids``) is merged with merge_insert and marked compacted in
        the same commit, one commit per shard: a compaction that lost the race
        to another one (any process) commits nothing for that shard
        (``result.stale``); conflicts replay the immutable SSTables.
        See :func:`lance_async.memwal.compact_mem_wal` for the parameters, the
        result and the errors.

        Each engine call of the compaction may wait on the store for
        :attr:`storage_timeout` seconds at most (then it is given up; what
        was committed before stays committed and consistent).

        Raises
        ------
        ValueError, TypeError
            ``chunk_rows`` or ``max_generations`` below 1 (at the call).
        StorageError
            The store refused or failed a request, or an engine call did not
            return within ``storage_timeout`` (:class:`StorageTimeoutError`).
        """
        check_int("chunk_rows", chunk_rows, minimum=1)
        if max_generations is not None:
            check_int("max_generations", max_generations, minimum=1)
        try:
            with call_timeouts(self.storage_timeout):
                return await compact_mem_wal(
                    self._facade(),
                    shard_ids,
                    chunk_rows=chunk_rows,
                    optimize_indices=optimize_indices,
                    max_generations=max_generations,
                )
        except (OSError, ValueError, RuntimeError) as exc:
            raise_mapped(exc)
            raise
