"""Opening a shard's engine writer: the claim, the replayed rows, the deadline.

What a shard writer does before its writer task starts (``committer.py``):
``LanceDataset.mem_wal_writer`` on a worker thread within
``storage_timeout`` (claiming the shard: a writer of it elsewhere is
fenced), the rows the previous writer left in the WAL flushed to a
generation (:func:`settle_replayed`), the engine options the commit policy
adds, and an open abandoned at its deadline kept or closed when it returns
(``abandoned.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, NamedTuple

from .._engine_errors import raise_mapped
from .._metrics import track_queue
from .._threads import run_sync
from ..errors import InvalidInputError, StorageTimeoutError
from ..lsm.manifest import read_shard_manifest
from ..lsm.snapshots import retired_shards
from .abandoned import close_late_open, count_late_open, keep_late_open
from .policy import CommitPolicy, WriterConfig, engine_options
from .sharding import Sharding, sharding_of

__all__ = [
    "DEFAULT_MAX_MEMTABLE_ROWS",
    "OpenedEngine",
    "claimed_epoch",
    "open_engine",
    "settle_replayed",
    "start_engine",
]

log = logging.getLogger("lance_async.memwal")

DEFAULT_MAX_MEMTABLE_ROWS = 100_000
"""pylance 14's default ``max_memtable_rows``."""


def settle_replayed(engine: Any, reopen: Callable[[], Any]) -> Any:
    """Flush rows an engine writer replayed from the WAL, then reopen it (blocking).

    A writer that opens a shard gets the previous writer's unflushed rows
    replayed from the WAL into its memtable, which this writer's mirror never
    saw. Closing flushes them to a generation; the writer is opened again,
    empty. Returns the engine writer to use: ``engine`` itself when its
    memtable is empty, else the new one from ``reopen()``.
    """
    stats = engine.memtable_stats()
    if not stats.get("row_count") and not stats.get("frozen_count"):
        return engine
    engine.close()
    return reopen()


class OpenedEngine(NamedTuple):
    """What :func:`open_engine` opened."""

    engine: Any
    """The engine's ``ShardWriter``, its memtable empty."""
    memtable_rows: int
    """The memtable's row limit (the writer's option, the MemWAL's default, or the engine's)."""
    sharding: Sharding
    """The table's sharding."""
    options: dict[str, Any]
    """The keywords the engine writer was opened with."""
    reopen: Callable[[], Any]
    """Opens the engine writer again with the same keywords (blocking)."""
    epoch: int
    """The writer epoch it claimed (0 if the manifest could not say)."""


def claimed_epoch(uri: str, shard_id: str, storage_options: Mapping[str, str] | None) -> int:
    """The writer epoch recorded in the shard's manifest now (blocking; 0 if none)."""
    manifest = read_shard_manifest(uri, shard_id, storage_options)
    return manifest.writer_epoch if manifest is not None else 0


def open_engine(
    ds: Any,
    shard_id: str,
    options: Mapping[str, Any],
    policy: CommitPolicy,
    storage_options: Mapping[str, str] | None = None,
) -> OpenedEngine:
    """Open the engine's ``ShardWriter`` for ``shard_id`` (blocking).

    Opening claims the shard: a writer still open on it elsewhere is fenced.
    Rows the previous writer left in the WAL are replayed by the engine and
    flushed at once (:func:`settle_replayed`), so the memtable starts empty.
    The engine writer is opened with ``options`` plus what ``policy`` adds
    (see :func:`~lance_async.memwal.policy.engine_options`).

    Raises
    ------
    InvalidInputError
        No MemWAL; the shard was retired by a later ``initialize_mem_wal``
        (see ``retired.py``); or the table is bucket- or unsharded-sharded
        and ``shard_id`` is none of its shards (checked before the claim).
    OSError, ValueError, RuntimeError
        The engine's errors, unchanged (the caller maps them).
    """
    latest = ds.checkout_version(ds.latest_version)
    track_queue(shard_id, ds.uri)
    if shard_id in retired_shards(latest):
        raise InvalidInputError(
            f"shard {shard_id} belongs to a MemWAL that this table replaced "
            "(an overwrite, then initialize_mem_wal); opening it would replay the old "
            "table's rows. Use another shard id"
        )
    details = latest.mem_wal_index_details()
    sharding = sharding_of(details, latest)
    if sharding.kind in ("bucket", "unsharded") and sharding.value_of(shard_id) is None:
        raise InvalidInputError(
            f"shard {shard_id} is not a shard of this table: its MemWAL is {sharding.kind}-"
            f"sharded{f' on {sharding.column!r}' if sharding.column else ''}, and every key "
            "has one shard. Write through dataset.mem_wal_writer() (no shard id), which "
            "routes each row to its shard, or name one of (await dataset.sharding()).shard_ids()"
        )
    defaults = (details or {}).get("writer_config_defaults") or {}
    opened = engine_options(policy, options, defaults)

    def reopen() -> Any:
        return ds.mem_wal_writer(shard_id, **opened)

    engine = settle_replayed(reopen(), reopen)
    epoch = claimed_epoch(str(ds.uri), shard_id, storage_options)
    limit = opened.get("max_memtable_rows")
    if limit is None:
        limit = defaults.get("max_memtable_rows")
    return OpenedEngine(
        engine, int(limit or DEFAULT_MAX_MEMTABLE_ROWS), sharding, opened, reopen, epoch
    )


async def start_engine(
    ds: Any,
    shard_id: str,
    config: WriterConfig,
    timeout: float,
    describe: str,
    storage_options: Mapping[str, str] | None = None,
    keep_late: Callable[[], bool] | None = None,
) -> OpenedEngine:
    """:func:`open_engine` on a worker thread, within ``timeout`` seconds.

    An open still running at the deadline is abandoned
    (:class:`~lance_async.StorageTimeoutError`, counted in
    :func:`~lance_async.memwal.healing.late_opens` until it returns); should it return later, the
    engine writer it opened is closed on its thread, so nobody holds it
    (its claim of the shard stays: a writer opened since is fenced) --
    unless ``keep_late()`` says, then, that the opener still wants it:
    it is kept for :func:`~lance_async.memwal.healing.take_late_open`
    instead (see :mod:`lance_async.memwal.healing`).

    Raises
    ------
    LanceAsyncError
        The engine's errors, mapped (:func:`~lance_async._engine_errors.map_engine_error`);
        :class:`InvalidInputError` as :func:`open_engine`.
    OSError, ValueError, RuntimeError
        An engine error with no lance_async meaning, unchanged.
    """
    key = (str(ds.uri), shard_id)

    def late(opened: OpenedEngine | None, error: BaseException | None) -> None:
        try:
            if opened is not None and keep_late is not None and keep_late():
                keep_late_open(key, opened)
                log.info("lance_async: %s returned after all; kept for its next use", describe)
            else:
                close_late_open(opened)
        finally:
            count_late_open(key, -1)

    try:
        return await run_sync(
            partial(open_engine, ds, shard_id, config.engine, config.policy, storage_options),
            timeout=timeout,
            what=f"opening {describe}",
            on_late_result=late,
        )
    except StorageTimeoutError:
        count_late_open(key, +1)  # abandoned: it may still claim the shard (late_opens)
        raise
    except (OSError, ValueError, RuntimeError) as exc:
        raise_mapped(exc)
        raise
